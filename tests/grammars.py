"""A Lark grammar as agents send one: the `apply_patch` grammar of Codex CLI's free-form
`apply_patch` tool (its `tool_apply_patch.lark`, in OpenAI's Lark dialect), and a patch
that follows it."""

APPLY_PATCH_LARK = r"""start: begin_patch hunk+ end_patch
begin_patch: "*** Begin Patch" LF
end_patch: "*** End Patch" LF?

hunk: add_hunk | delete_hunk | update_hunk
add_hunk: "*** Add File: " filename LF add_line+
delete_hunk: "*** Delete File: " filename LF
update_hunk: "*** Update File: " filename LF change_move? change?

filename: /(.+)/
add_line: "+" /(.*)/ LF -> line

change_move: "*** Move to: " filename LF
change: (change_context | change_line)+ eof_line?
change_context: ("@@" | "@@ " /(.+)/) LF
change_line: ("+" | "-" | " ") /(.*)/ LF
eof_line: "*** End of File" LF

%import common.LF
"""

PATCH = "*** Begin Patch\n*** Add File: hi.txt\n+hi\n*** End Patch"
