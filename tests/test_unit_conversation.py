"""Every protocol's surfaces see a request as the same conversation, and its prefix key
stays the same from the first turn on."""

from __future__ import annotations

from portcullis.adapters.protocols.registry import protocol
from portcullis.engine.conversation import prefix_key, session_key

SYSTEM, TASK = "You are a coding agent.", "Rename the variable x to total."


def first_and_second_turns(name: str) -> tuple[dict, dict]:
    if name in ("anthropic_messages", "bedrock_invoke"):
        first = {"system": [{"type": "text", "text": SYSTEM}], "messages": [{"role": "user", "content": [{"type": "text", "text": TASK}]}]}
        turns = [
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "edit", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]},
        ]
        return first, {**first, "messages": first["messages"] + turns}
    if name == "openai_chat":
        first = {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]}
        turns = [
            {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "edit", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        ]
        return first, {"messages": first["messages"] + turns}
    if name == "openai_responses":
        first = {"instructions": SYSTEM, "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": TASK}]}]}
        turns = [
            {"type": "function_call", "call_id": "c1", "name": "edit", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        ]
        return first, {**first, "input": first["input"] + turns}
    assert name == "bedrock_converse"
    first = {"system": [{"text": SYSTEM}], "messages": [{"role": "user", "content": [{"text": TASK}]}]}
    turns = [
        {"role": "assistant", "content": [{"toolUse": {"toolUseId": "t1", "name": "edit", "input": {}}}]},
        {"role": "user", "content": [{"toolResult": {"toolUseId": "t1", "content": [{"text": "ok"}]}}]},
    ]
    return first, {**first, "messages": first["messages"] + turns}


PROTOCOLS = ("anthropic_messages", "bedrock_invoke", "openai_chat", "openai_responses", "bedrock_converse")


def test_every_protocol_sees_the_same_conversation_and_key_across_turns() -> None:
    keys = set()
    for name in PROTOCOLS:
        first, second = first_and_second_turns(name)
        surfaces = protocol(name).surfaces
        one, two = surfaces.conversation(first), surfaces.conversation(second)
        assert one.system == (SYSTEM,) and one.first_user_texts == (TASK,) and one.first_message == (TASK,), name
        assert (one.turns, one.messages) == (1, 1), name
        assert (two.turns, two.messages) == (2, 3), name  # the tool result is a turn of the agent's loop
        assert prefix_key("payments", ["edit"], one, 2) == prefix_key("payments", ["edit"], two, 2), name
        keys.add(prefix_key("payments", ["edit"], one, 2))
    assert len(keys) == 1  # the same conversation in any protocol has one key


def test_the_key_depends_on_team_tools_system_and_first_message() -> None:
    first, _ = first_and_second_turns("anthropic_messages")
    conversation = protocol("anthropic_messages").surfaces.conversation(first)
    base = prefix_key("payments", ["edit"], conversation, 2)
    assert prefix_key("research", ["edit"], conversation, 2) != base
    assert prefix_key("payments", ["edit", "bash"], conversation, 2) != base
    assert prefix_key("payments", ["ed", "it"], conversation, 2) != base  # parts are separated, not concatenated
    other = protocol("anthropic_messages").surfaces.conversation({**first, "messages": [{"role": "user", "content": "another task"}]})
    assert prefix_key("payments", ["edit"], other, 2) != base
    assert prefix_key("payments", ["edit"], conversation, 0) != base  # system blocks hashed only when asked for


def test_a_session_is_the_clients_id_when_sent_scoped_to_the_principal() -> None:
    assert session_key("payments", "alice", "s-1", "prefix-a") == session_key("payments", "alice", "s-1", "prefix-b")
    assert session_key("payments", "alice", "s-1", "p") != session_key("payments", "bob", "s-1", "p")
    assert session_key("payments", "alice", "s-1", "p") != session_key("research", "alice", "s-1", "p")
    assert session_key("payments", "alice", None, "prefix-a") != session_key("payments", "alice", None, "prefix-b")


def test_malformed_bodies_give_an_empty_view_not_an_error() -> None:
    for name in PROTOCOLS:
        surfaces = protocol(name).surfaces
        assert surfaces.conversation({"messages": "nope", "system": 3, "input": 7, "instructions": None}).messages == 0, name


def test_reasoning_requested_is_seen_in_every_protocol() -> None:
    asked = {
        "anthropic_messages": ({"thinking": {"type": "enabled", "budget_tokens": 2048}}, {"thinking": {"type": "disabled"}}),
        "openai_chat": ({"reasoning_effort": "high"}, {"reasoning_effort": "none"}),
        "openai_responses": ({"reasoning": {"effort": "medium"}}, {"reasoning": {"summary": "auto"}}),
        "bedrock_converse": ({"additionalModelRequestFields": {"thinking": {"type": "enabled", "budget_tokens": 1024}}}, {"additionalModelRequestFields": {}}),
    }
    for name, (on, off) in asked.items():
        first, _ = first_and_second_turns(name)
        surfaces = protocol(name).surfaces
        assert surfaces.conversation({**first, **on}).reasoning, name
        assert not surfaces.conversation({**first, **off}).reasoning, name
        assert not surfaces.conversation(first).reasoning, name


def test_the_task_leaves_out_the_context_an_agent_puts_beside_the_ask() -> None:
    reminder = "<system-reminder>\nContext: this project uses a security review and a design doc.\n</system-reminder>"
    environment = '<environment_context cwd="/repo">\n  <shell>bash</shell>\n</environment_context>'
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": reminder}, {"type": "text", "text": TASK}]}]}
    conversation = protocol("anthropic_messages").surfaces.conversation(body)
    assert conversation.first_user_texts == (TASK,)
    assert conversation.first_message == (reminder, TASK)  # the prefix still hashes the whole message
    responses = {"input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": environment}, {"type": "input_text", "text": TASK}]}]}
    assert protocol("openai_responses").surfaces.conversation(responses).first_user_texts == (TASK,)
    only_context = {"messages": [{"role": "user", "content": [{"type": "text", "text": reminder}]}]}
    assert protocol("anthropic_messages").surfaces.conversation(only_context).first_user_texts == (reminder,)
    # an ask that merely starts with markup, or mentions a tag, is the ask
    for ask in ("<b>Bold</b> this heading please", "Why does </div> close <div> here?", "<p>one</p> and <p>two</p>", "<main>the page</main>"):
        asked = {"messages": [{"role": "user", "content": [{"type": "text", "text": reminder}, {"type": "text", "text": ask}]}]}
        assert protocol("anthropic_messages").surfaces.conversation(asked).first_user_texts == (ask,), ask
