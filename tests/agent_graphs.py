"""The smallest LangGraph agent: the model answers, the tools it calls run, the model
answers again, until it makes no call. Tests drive the gateway with it as agents do."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.messages import BaseMessage
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode, tools_condition


def tool_agent(
    model: Runnable[Any, BaseMessage], tools: Sequence[BaseTool]
) -> CompiledStateGraph[MessagesState, None, MessagesState, MessagesState]:
    """`model`: a chat model with `tools` bound."""

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode(list(tools)))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile()
