"""The request and answer schemas of the gateway's OpenAPI document (gateway/api/openapi.py
puts them under `components.schemas`): OpenAI's published shapes in the fields the gateway
reads, open to every other field (it is passed to the engine); the gateway's own objects
(sessions, checkpoints, artifacts) in full; the error every route answers with.
"""

from __future__ import annotations

from typing import Any


def ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


MAX_TOKENS = {
    "type": ["integer", "null"],
    "minimum": 1,
    "maximum": 131_072,
    "description": "At most `limits.max_tokens` (131072 by default, shown here).",
}

SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["message", "type", "param", "code"],
                "properties": {
                    "message": {"type": "string"},
                    "type": {"type": "string"},
                    "param": {"type": ["string", "null"]},
                    "code": {"type": ["string", "null"]},
                },
            }
        },
    },
    "ChatMessage": {
        "oneOf": [
            {
                "type": "object",
                "required": ["role", "content"],
                "properties": {
                    "role": {"enum": ["system", "developer", "user"]},
                    "content": {"type": "string"},
                    "name": {"type": "string"},
                },
            },
            {
                "type": "object",
                "required": ["role"],
                "properties": {
                    "role": {"const": "assistant"},
                    "content": {"type": ["string", "null"]},
                    "tool_calls": {"type": "array", "items": ref("ToolCall")},
                },
            },
            {
                "type": "object",
                "required": ["role", "content", "tool_call_id"],
                "properties": {
                    "role": {"const": "tool"},
                    "content": {"type": "string"},
                    "tool_call_id": {"type": "string"},
                },
            },
        ]
    },
    "ToolCall": {
        "type": "object",
        "required": ["id", "type", "function"],
        "properties": {
            "id": {"type": "string"},
            "type": {"const": "function"},
            "function": {
                "type": "object",
                "required": ["name", "arguments"],
                "properties": {"name": {"type": "string"}, "arguments": {"type": "string"}},
            },
        },
    },
    "Tool": {
        "type": "object",
        "required": ["type", "function"],
        "properties": {
            "type": {"const": "function"},
            "function": {
                "type": "object",
                "required": ["name"],
                "properties": {
                    "name": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"},
                    "description": {"type": "string"},
                    "parameters": {"type": "object"},
                    "strict": {"type": "boolean"},
                },
            },
        },
    },
    "ChatCompletionRequest": {
        "type": "object",
        "description": "OpenAI's chat completion request; fields not listed pass to the engine.",
        "required": ["model", "messages"],
        "properties": {
            "model": {"type": "string", "minLength": 1},
            "messages": {
                "type": "array",
                "minItems": 1,
                "description": "At most `limits.max_messages` (2048 by default).",
                "items": ref("ChatMessage"),
            },
            "tools": {
                "type": "array",
                "description": "At most `limits.max_tools` (256 by default).",
                "items": ref("Tool"),
            },
            "tool_choice": {"anyOf": [{"enum": ["none", "auto", "required"]}, {"type": "object"}]},
            "stream": {"type": ["boolean", "null"]},
            "stream_options": {
                "type": ["object", "null"],
                "properties": {"include_usage": {"type": "boolean"}},
            },
            "max_tokens": MAX_TOKENS,
            "max_completion_tokens": MAX_TOKENS,
            "temperature": {"type": ["number", "null"], "minimum": 0, "maximum": 2},
            "top_p": {"type": ["number", "null"], "minimum": 0, "maximum": 1},
            "n": {
                "type": ["integer", "null"],
                "minimum": 1,
                "maximum": 16,
                "description": "At most `limits.max_n` (16 by default, shown here).",
            },
            "seed": {"type": ["integer", "null"]},
            "user": {"type": "string"},
            "metadata": {"type": ["object", "null"], "additionalProperties": {"type": "string"}},
            "response_format": {"type": "object"},
        },
    },
    "ChatCompletion": {
        "type": "object",
        "required": ["id", "object", "choices"],
        "properties": {
            "id": {"type": "string"},
            "object": {"const": "chat.completion"},
            "created": {"type": "integer"},
            "model": {"type": "string"},
            "choices": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["index", "message"],
                    "properties": {
                        "index": {"type": "integer"},
                        "message": {"type": "object"},
                        "finish_reason": {"type": ["string", "null"]},
                    },
                },
            },
            "usage": ref("Usage"),
        },
    },
    "Usage": {
        "type": "object",
        "properties": {
            "prompt_tokens": {"type": "integer"},
            "completion_tokens": {"type": "integer"},
            "total_tokens": {"type": "integer"},
        },
    },
    "CompletionRequest": {
        "type": "object",
        "required": ["model", "prompt"],
        "properties": {
            "model": {"type": "string", "minLength": 1},
            "prompt": {
                "anyOf": [
                    {"type": "string"},
                    {"type": "array", "items": {"type": "string"}, "minItems": 1},
                ]
            },
            "stream": {"type": ["boolean", "null"]},
            "max_tokens": MAX_TOKENS,
            "temperature": {"type": ["number", "null"], "minimum": 0, "maximum": 2},
        },
    },
    "Completion": {
        "type": "object",
        "required": ["id", "object", "choices"],
        "properties": {
            "id": {"type": "string"},
            "object": {"const": "text_completion"},
            "choices": {"type": "array", "items": {"type": "object"}},
            "usage": ref("Usage"),
        },
    },
    "EmbeddingRequest": {
        "type": "object",
        "required": ["model", "input"],
        "properties": {
            "model": {"type": "string", "minLength": 1},
            "input": {
                "anyOf": [
                    {"type": "string"},
                    {"type": "array", "items": {"type": "string"}, "minItems": 1},
                ]
            },
            "encoding_format": {"enum": ["float", "base64"]},
        },
    },
    "EmbeddingList": {
        "type": "object",
        "required": ["object", "data"],
        "properties": {
            "object": {"const": "list"},
            "data": {"type": "array", "items": {"type": "object"}},
            "model": {"type": "string"},
            "usage": {"type": "object"},
        },
    },
    "ResponseRequest": {
        "type": "object",
        "description": "OpenAI's Responses API request, function tools only.",
        "required": ["model", "input"],
        "properties": {
            "model": {"type": "string", "minLength": 1},
            "input": {
                "anyOf": [
                    {"type": "string"},
                    {
                        "type": "array",
                        "description": "At most `limits.max_messages` items.",
                        "items": {
                            "type": "object",
                            "required": ["role", "content"],
                            "properties": {
                                "type": {"const": "message"},
                                "role": {"enum": ["user", "assistant", "system", "developer"]},
                                "content": {"type": "string"},
                            },
                        },
                    },
                ]
            },
            "instructions": {"type": ["string", "null"]},
            "previous_response_id": {"type": ["string", "null"]},
            "context_management": {
                "type": ["array", "null"],
                "description": "Server-side compaction past a token threshold.",
                "items": {
                    "type": "object",
                    "required": ["type"],
                    "properties": {
                        "type": {"const": "compaction"},
                        "compact_threshold": {"type": ["integer", "null"], "minimum": 1000},
                    },
                },
            },
            "store": {"type": ["boolean", "null"]},
            "stream": {"type": ["boolean", "null"]},
            "max_output_tokens": {**MAX_TOKENS, "minimum": 16},
            "temperature": {"type": ["number", "null"], "minimum": 0, "maximum": 2},
            "top_p": {"type": ["number", "null"], "minimum": 0, "maximum": 1},
            "metadata": {"type": ["object", "null"], "additionalProperties": {"type": "string"}},
            "tools": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["type", "name"],
                    "properties": {
                        "type": {"const": "function"},
                        "name": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"},
                        "description": {"type": "string"},
                        "parameters": {"type": "object"},
                    },
                },
            },
        },
    },
    "InputTokensRequest": {
        "type": "object",
        "description": "A Responses API request to count, not run: `input` may be left out.",
        "required": ["model"],
        "properties": {
            "model": {"type": "string", "minLength": 1},
            "input": {"type": ["string", "array"]},
            "instructions": {"type": ["string", "null"]},
            "previous_response_id": {"type": ["string", "null"]},
            "tools": {"type": "array", "items": {"type": "object"}},
        },
    },
    "CompactRequest": {
        "type": "object",
        "description": "The conversation to compact: `input` items (a compaction item among "
        "them is expanded first), after `previous_response_id`'s history if given.",
        "required": ["model", "input"],
        "properties": {
            "model": {"type": "string", "minLength": 1},
            "input": {"type": ["string", "array"]},
            "instructions": {"type": ["string", "null"]},
            "previous_response_id": {"type": ["string", "null"]},
        },
    },
    "CompactedResponse": {
        "type": "object",
        "required": ["id", "object", "created_at", "output", "usage"],
        "properties": {
            "id": {"type": "string"},
            "object": {"const": "response.compaction"},
            "created_at": {"type": "integer"},
            "output": {"type": "array", "items": {"type": "object"}},
            "usage": {"type": "object"},
        },
    },
    "InputTokenCount": {
        "type": "object",
        "required": ["object", "input_tokens"],
        "properties": {
            "object": {"const": "response.input_tokens"},
            "input_tokens": {"type": "integer"},
        },
    },
    "Response": {
        "type": "object",
        "required": ["id", "object", "created_at", "status", "model", "output"],
        "properties": {
            "id": {"type": "string"},
            "object": {"const": "response"},
            "created_at": {"type": "integer"},
            "status": {"enum": ["completed", "incomplete", "in_progress", "failed"]},
            "model": {"type": "string"},
            "output": {"type": "array", "items": {"type": "object"}},
            "usage": {"type": "object"},
        },
    },
    "ResponseItemList": {
        "type": "object",
        "required": ["object", "data", "first_id", "last_id", "has_more"],
        "properties": {
            "object": {"const": "list"},
            "data": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["id", "type"],
                    "properties": {"id": {"type": "string"}, "type": {"type": "string"}},
                },
            },
            "first_id": {"type": ["string", "null"]},
            "last_id": {"type": ["string", "null"]},
            "has_more": {"type": "boolean"},
        },
    },
    "Deleted": {
        "type": "object",
        "required": ["id", "object", "deleted"],
        "properties": {
            "id": {"type": "string"},
            "object": {"type": "string"},
            "deleted": {"const": True},
        },
    },
    "Model": {
        "type": "object",
        "required": ["id", "object", "created", "owned_by"],
        "properties": {
            "id": {"type": "string"},
            "object": {"const": "model"},
            "created": {"type": "integer"},
            "owned_by": {"type": "string"},
            "max_model_len": {
                "type": "integer",
                "description": "The context window in tokens, as vLLM lists it: the smallest "
                "of the engines that may serve the model. Absent until an engine has said.",
            },
        },
    },
    "ModelList": {
        "type": "object",
        "required": ["object", "data"],
        "properties": {
            "object": {"const": "list"},
            "data": {"type": "array", "items": ref("Model")},
        },
    },
    "UsageReport": {
        "type": "object",
        "required": ["object"],
        "properties": {
            "object": {"enum": ["usage", "session.usage"]},
            "data": {"type": "array", "items": {"type": "object"}},
            "totals": {"type": "object"},
        },
    },
    "CheckpointList": {
        "type": "object",
        "required": ["object", "session_id", "data"],
        "properties": {
            "object": {"const": "list"},
            "session_id": {"type": "string"},
            "data": {"type": "array", "items": {"type": "object", "required": ["turn"]}},
        },
    },
    "Checkpoint": {
        "type": "object",
        "required": ["object", "session_id", "turn", "client_messages", "engine_request"],
        "properties": {
            "object": {"const": "session.checkpoint"},
            "session_id": {"type": "string"},
            "turn": {"type": "integer", "minimum": 1},
            "client_messages": {"type": "array"},
            "engine_request": {"type": "object"},
        },
    },
    "ForkRequest": {
        "type": "object",
        "properties": {
            "turn": {"type": "integer", "minimum": 1},
            "session_id": {"type": "string"},
        },
    },
    "Session": {
        "type": "object",
        "required": ["object", "id", "turns"],
        "properties": {
            "object": {"const": "session"},
            "id": {"type": "string"},
            "turns": {"type": "integer"},
        },
    },
    "Artifact": {
        "type": "object",
        "required": ["object", "id", "session_id"],
        "properties": {"object": {"const": "session.artifact"}, "id": {"type": "string"}},
    },
    "ServerSentEvent": {
        "type": "object",
        "description": "One event: `data` is a JSON chunk, or `[DONE]` at the end.",
        "required": ["data"],
        "properties": {"event": {"type": "string"}, "data": {"type": "string"}},
    },
    # The Anthropic Messages API (gateway/anthropic/): Anthropic's published shapes in the
    # fields the gateway reads.
    "AnthropicError": {
        "type": "object",
        "required": ["type", "error"],
        "properties": {
            "type": {"const": "error"},
            "error": {
                "type": "object",
                "required": ["type", "message"],
                "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
            },
            "request_id": {"type": "string"},
        },
    },
    "MessageRequest": {
        "type": "object",
        "description": "Anthropic's Messages API request: text, base64 images, client tools.",
        "required": ["model", "max_tokens", "messages"],
        "properties": {
            "model": {"type": "string", "minLength": 1},
            "max_tokens": {**MAX_TOKENS, "type": "integer"},
            "messages": {"$ref": "#/components/schemas/AnthropicMessages"},
            "system": {"type": ["string", "array"]},
            "stream": {"type": "boolean"},
            "stop_sequences": {"type": "array", "items": {"type": "string"}},
            "temperature": {"type": "number", "minimum": 0, "maximum": 1},
            "top_p": {"type": "number", "minimum": 0, "maximum": 1},
            "top_k": {"type": "integer", "minimum": 0},
            "metadata": {"type": "object", "properties": {"user_id": {"type": "string"}}},
            "tools": {"$ref": "#/components/schemas/AnthropicTools"},
            "tool_choice": {
                "type": "object",
                "required": ["type"],
                "properties": {
                    "type": {"enum": ["auto", "any", "tool", "none"]},
                    "name": {"type": "string"},
                    "disable_parallel_tool_use": {"type": "boolean"},
                },
            },
            "thinking": {
                "type": "object",
                "required": ["type"],
                "properties": {"type": {"enum": ["enabled", "disabled", "adaptive"]}},
            },
            "context_management": {"$ref": "#/components/schemas/AnthropicContextManagement"},
            "compaction": {
                "type": "object",
                "description": "Compact the conversation now, on the gateway's trimming "
                "(gateway/anthropic/compaction.py); the answer is the compaction block alone.",
                "required": ["type"],
                "properties": {"type": {"const": "summarize"}},
            },
        },
    },
    "AnthropicContextManagement": {
        "type": "object",
        "description": "Context editing (gateway/anthropic/context_editing.py): applied by "
        "the gateway before the engine is asked.",
        "properties": {
            "edits": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["type"],
                    "properties": {
                        "type": {
                            "enum": [
                                "clear_tool_uses_20250919",
                                "clear_thinking_20251015",
                                "compact_20260112",
                            ]
                        },
                        "trigger": {"type": "object"},
                        "pause_after_compaction": {"type": "boolean"},
                        "keep": {"type": ["object", "string"]},
                        "clear_at_least": {"type": "object"},
                        "exclude_tools": {"type": "array", "items": {"type": "string"}},
                        "clear_tool_inputs": {"type": ["boolean", "array"]},
                    },
                },
            }
        },
    },
    "AnthropicAppliedEdits": {
        "type": "object",
        "description": "What the request's context edits cleared.",
        "required": ["applied_edits"],
        "properties": {
            "applied_edits": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["type", "cleared_input_tokens"],
                    "properties": {
                        "type": {"type": "string"},
                        "cleared_tool_uses": {"type": "integer"},
                        "cleared_input_tokens": {"type": "integer"},
                    },
                },
            }
        },
    },
    "MessageCountTokensRequest": {
        "type": "object",
        "required": ["model", "messages"],
        "properties": {
            "model": {"type": "string", "minLength": 1},
            "messages": {"$ref": "#/components/schemas/AnthropicMessages"},
            "system": {"type": ["string", "array"]},
            "tools": {"$ref": "#/components/schemas/AnthropicTools"},
            "context_management": {"$ref": "#/components/schemas/AnthropicContextManagement"},
        },
    },
    "AnthropicMessages": {
        "type": "array",
        "description": "At most `limits.max_messages` messages.",
        "items": {
            "type": "object",
            "required": ["role", "content"],
            "properties": {
                "role": {"enum": ["user", "assistant"]},
                "content": {"type": ["string", "array"]},
            },
        },
    },
    "AnthropicTools": {
        "type": "array",
        "items": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"},
                "description": {"type": "string"},
                "input_schema": {"type": "object"},
                "type": {"type": "string"},
            },
        },
    },
    "Message": {
        "type": "object",
        "required": ["id", "type", "role", "model", "content", "stop_reason", "usage"],
        "properties": {
            "id": {"type": "string"},
            "type": {"const": "message"},
            "role": {"const": "assistant"},
            "model": {"type": "string"},
            "content": {"type": "array", "items": {"type": "object"}},
            "stop_reason": {
                "enum": ["end_turn", "max_tokens", "stop_sequence", "tool_use", "compaction"]
            },
            "stop_sequence": {"type": ["string", "null"]},
            "usage": {
                "type": "object",
                "required": ["input_tokens", "output_tokens"],
                "properties": {
                    "input_tokens": {"type": "integer"},
                    "output_tokens": {"type": "integer"},
                    "cache_read_input_tokens": {"type": "integer"},
                    "cache_creation_input_tokens": {"type": "integer"},
                },
            },
            "context_management": {"$ref": "#/components/schemas/AnthropicAppliedEdits"},
        },
    },
    "MessageTokensCount": {
        "type": "object",
        "required": ["input_tokens"],
        "properties": {
            "input_tokens": {"type": "integer"},
            "context_management": {
                "type": "object",
                "required": ["original_input_tokens"],
                "properties": {"original_input_tokens": {"type": "integer"}},
            },
        },
    },
    "Status": {
        "type": "object",
        "required": ["status"],
        "properties": {"status": {"type": "string"}},
    },
}
