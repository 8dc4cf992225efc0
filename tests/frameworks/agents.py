"""CrewAI and AutoGen agents pointed at the gateway, run in their own environment
(`.venv-frameworks`, tests/frameworks/env.sh) by tests/integration/test_frameworks.py:

    .venv-frameworks/bin/python tests/frameworks/agents.py crewai BASE_URL BACKSTORY_FILE
    .venv-frameworks/bin/python tests/frameworks/agents.py autogen BASE_URL

Prints one JSON object: what the framework itself reports of the run (its outputs, the
token usage it counted, the tool call it received), for the test to check. Both frameworks
use their native OpenAI clients with only `base_url` changed, as a user would; the model
is the random-weight tiny Llama, so the text is noise and only the plumbing is checked.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

# Offline and quiet: CrewAI sends usage telemetry and traces of its own unless told not to.
os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("CREWAI_DISABLE_TRACKING", "true")
os.environ.setdefault("OTEL_SDK_DISABLED", "true")

MODEL = "tiny"


def lookup_booking(booking_id: str) -> str:
    """Look up a booking by its id."""
    return f"booking {booking_id}: confirmed"


def run_crewai(base_url: str, backstory: str) -> dict[str, Any]:
    """A two-agent sequential crew, streamed: a router classifies, a clerk with a tool
    answers with the router's output as context; both carry `backstory` (an agent's
    policy, as real crews do). Kicked off twice, each time built anew, as an agent service
    runs the same crew for request after request."""
    runs = [kickoff_crew(base_url, backstory) for _ in range(2)]
    return {"provider": runs[0]["provider"], "runs": runs}


def kickoff_crew(base_url: str, backstory: str) -> dict[str, Any]:
    from crewai import LLM, Agent, Crew, Process, Task
    from crewai.tools import tool

    # temperature 0: the random weights ending an answer at its first token, or opening a
    # tool-call markup the stream then drops, would leave an output empty (1 in ~700)
    llm = LLM(model=f"openai/{MODEL}", base_url=base_url, api_key="unused", max_tokens=16,
              stream=True, temperature=0)  # fmt: skip
    router = Agent(role="Router", goal="Classify the request", backstory=backstory, llm=llm,
                   max_iter=1)  # fmt: skip
    clerk = Agent(role="Clerk", goal="Check bookings", backstory=backstory, llm=llm,
                  tools=[tool("lookup_booking")(lookup_booking)], max_iter=1)  # fmt: skip
    classify = Task(description="Classify: 'is booking ABC123 confirmed?'",
                    expected_output="one word", agent=router)  # fmt: skip
    check = Task(description="Check booking ABC123", expected_output="its status",
                 agent=clerk, context=[classify])  # fmt: skip
    crew = Crew(agents=[router, clerk], tasks=[classify, check], process=Process.sequential)
    result = crew.kickoff()
    return {
        "provider": type(llm).__name__,
        "outputs": [task.raw for task in result.tasks_output],
        "usage": result.token_usage.model_dump(),
    }


async def run_autogen(base_url: str) -> dict[str, Any]:
    """An AssistantAgent with a tool, streaming its model calls; then a forced tool call
    through the same client class."""
    import openai
    from autogen_agentchat.agents import AssistantAgent
    from autogen_core.models import ModelInfo, UserMessage
    from autogen_core.tools import FunctionTool
    from autogen_ext.models.openai import OpenAIChatCompletionClient

    info = ModelInfo(vision=False, function_calling=True, json_output=True, family="unknown",
                     structured_output=True)  # fmt: skip
    # Usage in a stream only when asked for; asked of a non-streamed call it is a 400, as
    # OpenAI answers too, hence a client of its own.
    streaming = OpenAIChatCompletionClient(
        model=MODEL, base_url=base_url, api_key="unused", max_tokens=16, model_info=info,
        stream_options={"include_usage": True}, temperature=0,
    )  # fmt: skip
    agent = AssistantAgent("clerk", model_client=streaming, tools=[lookup_booking],
                           model_client_stream=True, system_message="You check bookings.")  # fmt: skip
    try:
        run = await agent.run(task="Is booking ABC123 confirmed?")
    finally:
        await streaming.close()
    reply = run.messages[-1]
    usage = reply.models_usage

    client = OpenAIChatCompletionClient(model=MODEL, base_url=base_url, api_key="unused",
                                        model_info=info, max_retries=0)  # fmt: skip
    booking = FunctionTool(lookup_booking, description="Look up a booking by its id.")
    forced: Any = None
    refused: dict[str, Any] | None = None
    try:
        forced = await client.create(
            [UserMessage(content="Check booking ABC123", source="user")],
            tools=[booking], tool_choice=booking,
            extra_create_args={"max_tokens": 60, "temperature": 0},
        )  # fmt: skip
    except openai.APIStatusError as exc:  # the gateway refused the call the model made
        refused = {"status": exc.status_code, "code": exc.code}
    finally:
        await client.close()
    content = None if forced is None else forced.content
    return {
        "messages": [type(m).__name__ for m in run.messages],
        "reply": reply.to_text(),
        "reply_usage": None if usage is None else asdict(usage),
        "forced_calls": [c.name for c in content] if isinstance(content, list) else None,
        "forced_text": content if isinstance(content, str) else None,
        "forced_usage": None if forced is None else asdict(forced.usage),
        "forced_refused": refused,
    }


def main() -> int:
    framework, base_url = sys.argv[1], sys.argv[2]
    if framework == "crewai":
        result = run_crewai(base_url, Path(sys.argv[3]).read_text(encoding="utf-8"))
    elif framework == "autogen":
        result = asyncio.run(run_autogen(base_url))
    else:
        print(f"unknown framework {framework!r}: crewai or autogen", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
