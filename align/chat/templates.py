"""Each format as a jinja chat template for ``tokenizer.apply_chat_template``.

A template renders exactly what ``align.chat.render`` renders for every valid
conversation (the tests check this on one shared list of conversations), so a model
trained here and served by vLLM or transformers sees the same text. Trained assistant
content is wrapped in ``{% generation %}`` so ``return_assistant_tokens_mask`` (TRL's
``assistant_only_loss``) marks the same tokens as ``align.chat.encode``.

Template variables beyond the standard ``messages``, ``tools``, ``add_generation_prompt``:

- ``enable_thinking``: Apertus ``Deliberation: enabled``; an error in the other formats.
- ``date_string``: the date in the Apertus default system text (``YYYY-MM-DD``). When it
  is not passed the template uses today (``strftime_now``), as ``render(chat_date=None)`` does.

The templates reject the structurally invalid input ``render`` rejects (unknown role,
tool message outside an assistant turn, mixed content, unknown block type, calls to
undeclared tools, an opening assistant message, two assistant messages in a row). Checks jinja cannot do (arguments that are not JSON, special tokens
inside texts) are left to ``render``/``encode``, which run on training data.
"""

from __future__ import annotations

from align.chat.formats import get_format

# Shared pieces: system/user text and the plain assistant text of tool-less formats.
_CONTENT_MACROS = r"""
{%- macro system_text(c) -%}
{%- if c is string -%}{{- c -}}
{%- elif c is mapping and c['text'] is string -%}{{- c['text'] -}}
{%- else -%}{{- raise_exception('message 0 (system): content must be a string or {"text": str}') -}}
{%- endif -%}
{%- endmacro -%}
{%- macro user_text(c, i) -%}
{%- if c is string -%}{{- c -}}
{%- elif c is mapping and c['parts'] is defined and c['parts'] is not string -%}
{%- for part in c['parts'] -%}
{%- if part is mapping and part['type'] == 'text' and part['text'] is string -%}{{- part['text'] -}}
{%- else -%}{{- raise_exception('message ' ~ i ~ ' (user): part ' ~ loop.index0 ~ ' is not a text part') -}}
{%- endif -%}
{%- endfor -%}
{%- else -%}{{- raise_exception('message ' ~ i ~ ' (user): content must be a string or {"parts": [...]}') -}}
{%- endif -%}
{%- endmacro -%}
"""

_PLAIN_ASSISTANT_MACRO = r"""
{%- macro plain_assistant_text(m, i) -%}
{%- if m['tool_calls'] -%}{{- raise_exception('message ' ~ i ~ ' (assistant): tool calls cannot be rendered in this format') -}}{%- endif -%}
{%- set c = m['content'] if m['content'] is defined else none -%}
{%- if c is string -%}{{- c -}}
{%- elif c is mapping and c['blocks'] is defined and c['blocks'] is not string -%}
{%- for b in c['blocks'] -%}
{%- if b is mapping and b['type'] == 'response' and b['text'] is string -%}{{- b['text'] -}}
{%- else -%}{{- raise_exception('message ' ~ i ~ ' (assistant): block ' ~ loop.index0 ~ ' cannot be rendered in this format') -}}
{%- endif -%}
{%- endfor -%}
{%- else -%}{{- raise_exception('message ' ~ i ~ ' (assistant): content must be a string or {"blocks": [...]}') -}}
{%- endif -%}
{%- endmacro -%}
{%- macro plain_text(m, i) -%}
{%- if m['role'] == 'system' -%}
{%- if i != 0 -%}{{- raise_exception('message ' ~ i ~ ' (system): a system message is only allowed at index 0') -}}{%- endif -%}
{{- system_text(m['content']) -}}
{%- elif m['role'] == 'user' -%}{{- user_text(m['content'], i) -}}
{%- elif m['role'] == 'assistant' -%}{{- plain_assistant_text(m, i) -}}
{%- elif m['role'] == 'tool' -%}{{- raise_exception('message ' ~ i ~ ' (tool): tool messages cannot be rendered in this format') -}}
{%- else -%}{{- raise_exception('message ' ~ i ~ ': unknown role ' ~ m['role']) -}}
{%- endif -%}
{%- endmacro -%}
{%- if tools -%}{{- raise_exception('this format has no tool declarations; use the apertus format') -}}{%- endif -%}
{%- if enable_thinking is defined and enable_thinking -%}{{- raise_exception('this format has no thinking mode') -}}{%- endif -%}
{%- if not messages -%}{{- raise_exception('conversation is empty: nothing to render') -}}{%- endif -%}
{%- set order = namespace(prev=none) -%}
{%- for message in messages -%}
{%- if message['role'] == 'assistant' and (order.prev is none or order.prev == 'system') -%}{{- raise_exception('message ' ~ loop.index0 ~ ' (assistant): the conversation opens with an assistant message') -}}{%- endif -%}
{%- if message['role'] == 'assistant' and order.prev == 'assistant' -%}{{- raise_exception('message ' ~ loop.index0 ~ ' (assistant): follows an assistant message with no user message between them') -}}{%- endif -%}
{%- set order.prev = message['role'] -%}
{%- endfor -%}
"""

_APERTUS = _CONTENT_MACROS + r"""
{#- align "apertus" template, training form: every assistant turn ends with <|assistant_end|>.
    Extra variables: enable_thinking, date_string (YYYY-MM-DD, default today). -#}
{#- Tool declarations as the released Apertus template writes them (align/chat/tools.py says
    how; the two runs of spaces are the release's own indentation, kept byte for byte). -#}
{%- macro ts_type(s) -%}
{%- if s is not mapping -%}any
{%- else -%}
{%- set kind = s['type'] -%}
{%- set null = ' | null' if s['nullable'] else '' -%}
{%- if kind == 'array' -%}
{%- set it = s['items'] -%}
{%- if not it -%}{%- set base = 'any[]' -%}
{%- else -%}
{%- set ik = it['type'] if it is mapping else none -%}
{%- if ik == 'string' -%}{%- set base = 'string[]' -%}
{%- elif ik == 'number' or ik == 'integer' -%}{%- set base = 'number[]' -%}
{%- elif ik == 'boolean' -%}{%- set base = 'boolean[]' -%}
{%- else -%}
{%- set inner = ts_type(it) -%}
{%- set base = 'any[]' if (inner == 'object | object' or inner | length > 50) else inner ~ '[]' -%}
{%- endif -%}
{%- endif -%}
{{- base ~ null -}}
{%- elif kind is sequence and kind is not string and kind is not mapping and kind | length > 0 -%}
{{- kind | join(' | ') -}}
{%- elif s['oneOf'] -%}
{%- for v in s['oneOf'] -%}
{{- ts_type(v) -}}
{%- if v is mapping -%}
{%- if v['description'] -%}{{- '// ' ~ v['description'] -}}{%- endif -%}
{%- if 'default' in v -%}{{- (' ' * 20) ~ '// default: ' ~ (v['default'] | tojson) -}}{%- endif -%}
{%- endif -%}
{%- if not loop.last -%}{{- ' | \n' -}}{%- endif -%}
{%- endfor -%}
{%- elif kind == 'string' -%}
{%- if s['enum'] -%}{{- '"' ~ (s['enum'] | join('" | "')) ~ '"' -}}{%- else -%}{{- 'string' ~ null -}}{%- endif -%}
{%- elif kind == 'number' or kind == 'integer' -%}number
{%- elif kind == 'boolean' -%}boolean
{%- elif kind == 'object' -%}
{%- if s['properties'] -%}
{%- set req = s['required'] or [] -%}
{{- '{\n' -}}
{%- for name, spec in s['properties'].items() -%}
{{- name ~ ('' if name in req else '?') ~ ': \n' ~ (' ' * 16) ~ ts_type(spec) -}}
{%- if not loop.last -%}{{- ', ' -}}{%- endif -%}
{%- endfor -%}
{{- '}' -}}
{%- else -%}object
{%- endif -%}
{%- else -%}any
{%- endif -%}
{%- endif -%}
{%- endmacro -%}
{%- macro default_comment(p) -%}
{%- if 'default' in p -%}
{%- set d = p['default'] -%}
{%- set text = d if d is string else (d | tojson) -%}
{%- if p['enum'] -%}{{- ', // default: ' ~ text -}}
{%- elif p['oneOf'] -%}{{- '// default: ' ~ text -}}
{%- else -%}{{- ', // default: ' ~ (d | tojson) -}}
{%- endif -%}
{%- endif -%}
{%- endmacro -%}
{%- macro declaration(fn) -%}
{%- if fn['description'] is defined and fn['description'] is not none -%}{{- '// ' ~ fn['description'] ~ '\n' -}}{%- endif -%}
{%- set params = fn['parameters'] if fn['parameters'] else {} -%}
{%- set props = params['properties'] if params['properties'] else {} -%}
{%- if not props -%}{{- 'type ' ~ fn['name'] ~ ' = () => any;' -}}
{%- else -%}
{%- set required = params['required'] if params['required'] else [] -%}
{{- 'type ' ~ fn['name'] ~ ' = (_: {\n' -}}
{%- for pname, pspec in props.items() -%}
{%- set p = pspec if pspec is mapping else {} -%}
{%- if p['description'] -%}{{- '// ' ~ p['description'] ~ '\n' -}}{%- endif -%}
{{- pname ~ ('' if pname in required else '?') ~ ': ' ~ ts_type(p) ~ default_comment(p) -}}
{%- if not loop.last -%}{{- ',\n' -}}{%- endif -%}
{%- endfor -%}
{{- '\n}) => any;' -}}
{%- endif -%}
{%- endmacro -%}
{%- macro call_list(calls, openai) -%}
{{- '<|tools_prefix|>[' -}}
{%- for c in calls -%}
{%- set f = c['function'] if openai else c -%}
{%- set args = f['arguments'] -%}
{{- '{' ~ (f['name'] | tojson) ~ ': ' ~ (args if args is string else (args | tojson)) ~ '}' -}}
{%- if not loop.last -%}{{- ', ' -}}{%- endif -%}
{%- endfor -%}
{{- ']<|tools_suffix|>' -}}
{%- endmacro -%}
{%- macro check_calls(calls, openai, names, i) -%}
{%- if names -%}
{%- for c in calls -%}
{%- set f = c['function'] if openai else c -%}
{%- if f['name'] not in names -%}
{{- raise_exception('message ' ~ i ~ ' (assistant): call to tool ' ~ f['name'] ~ ', which is not among the declared tools') -}}
{%- endif -%}
{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
{%- macro tool_payload(x) -%}{{- x if x is string else (x | tojson) -}}{%- endmacro -%}
{%- if not messages -%}{{- raise_exception('conversation is empty: nothing to render') -}}{%- endif -%}
{%- set decl = namespace(names=[]) -%}
{%- for tool in (tools or []) -%}
{%- set fn = tool['function'] if tool['function'] is defined else tool -%}
{%- set decl.names = decl.names + [fn['name']] -%}
{%- endfor -%}
{%- set st = namespace(start=0, in_turn=false, kind=none, in_inner=false, open_outputs=false, prev=none, prev_outputs=false) -%}
{{- '<s><|system_start|>' -}}
{%- if messages[0]['role'] == 'system' -%}
{{- system_text(messages[0]['content']) -}}
{%- set st.start = 1 -%}
{%- else -%}
{{- 'You are a helpful, honest and harmless assistant.\nCurrent date: ' -}}
{{- date_string if (date_string is defined and date_string) else strftime_now('%Y-%m-%d') -}}
{%- endif -%}
{{- '<|system_end|><|developer_start|>Deliberation: ' -}}
{{- 'enabled' if (enable_thinking is defined and enable_thinking) else 'disabled' -}}
{{- '\nTool Capabilities:' -}}
{%- if tools -%}
{%- for tool in tools -%}
{{- '\n' ~ declaration(tool['function'] if tool['function'] is defined else tool) -}}
{%- endfor -%}
{%- else -%}{{- ' disabled' -}}
{%- endif -%}
{{- '<|developer_end|>' -}}
{%- for message in messages -%}
{%- set i = loop.index0 -%}
{%- set role = message['role'] -%}
{%- set content = message['content'] if message['content'] is defined else none -%}
{%- if i < st.start -%}
{%- elif role == 'user' -%}
{%- if st.open_outputs -%}{{- ']' -}}{%- set st.open_outputs = false -%}{%- endif -%}
{%- if st.in_turn -%}
{%- generation -%}{{- '<|assistant_end|>' -}}{%- endgeneration -%}
{%- set st.in_turn = false -%}
{%- endif -%}
{{- '<|user_start|>' ~ user_text(content, i) ~ '<|user_end|>' -}}
{%- elif role == 'assistant' -%}
{%- if st.prev is none -%}{{- raise_exception('message ' ~ i ~ ' (assistant): the conversation opens with an assistant message') -}}{%- endif -%}
{%- if st.prev == 'assistant' and not st.prev_outputs -%}{{- raise_exception('message ' ~ i ~ ' (assistant): follows an assistant message with no user or tool message between them') -}}{%- endif -%}
{%- if not st.in_turn -%}
{{- '<|assistant_start|>' -}}
{%- set st.in_turn = true -%}{%- set st.kind = none -%}{%- set st.in_inner = false -%}
{%- endif -%}
{%- if content is mapping and content['blocks'] is defined and content['blocks'] is not string -%}
{%- if st.kind == 'string' -%}{{- raise_exception('message ' ~ i ~ ' (assistant): blocks content in an assistant turn with string content') -}}{%- endif -%}
{%- set st.kind = 'blocks' -%}
{%- for block in content['blocks'] -%}
{%- set btype = block['type'] if block is mapping else none -%}
{%- if btype == 'thoughts' -%}
{%- if st.open_outputs -%}{{- ']' -}}{%- set st.open_outputs = false -%}{%- endif -%}
{%- if not st.in_inner -%}
{%- generation -%}{{- '<|inner_prefix|>' -}}{%- endgeneration -%}
{%- set st.in_inner = true -%}
{%- endif -%}
{%- if block['text'] -%}{%- generation -%}{{- block['text'] -}}{%- endgeneration -%}{%- endif -%}
{%- elif btype == 'tool_calls' -%}
{{- check_calls(block['calls'], false, decl.names, i) -}}
{%- if st.open_outputs -%}{{- ']' -}}{%- set st.open_outputs = false -%}{%- endif -%}
{%- generation -%}{{- call_list(block['calls'], false) -}}{%- endgeneration -%}
{%- elif btype == 'tool_outputs' -%}
{%- if st.open_outputs -%}{{- raise_exception('message ' ~ i ~ ' (assistant): tool outputs given both as tool messages and as a tool_outputs block') -}}{%- endif -%}
{{- '[' -}}
{%- for o in block['outputs'] -%}
{{- tool_payload(o['output'] if o is mapping else o) -}}
{%- if not loop.last -%}{{- ', ' -}}{%- endif -%}
{%- endfor -%}
{{- ']' -}}
{%- elif btype == 'response' -%}
{%- if st.open_outputs -%}{{- ']' -}}{%- set st.open_outputs = false -%}{%- endif -%}
{%- if st.in_inner -%}
{%- generation -%}{{- '<|inner_suffix|>' -}}{%- endgeneration -%}
{%- set st.in_inner = false -%}
{%- endif -%}
{%- if block['text'] -%}{%- generation -%}{{- block['text'] -}}{%- endgeneration -%}{%- endif -%}
{%- else -%}
{{- raise_exception('message ' ~ i ~ ' (assistant): unknown block type ' ~ btype) -}}
{%- endif -%}
{%- endfor -%}
{%- elif content is string -%}
{%- if st.kind == 'blocks' -%}{{- raise_exception('message ' ~ i ~ ' (assistant): string content in an assistant turn with blocks content') -}}{%- endif -%}
{%- set st.kind = 'string' -%}
{%- if st.open_outputs -%}{{- ']' -}}{%- set st.open_outputs = false -%}{%- endif -%}
{%- if content -%}{%- generation -%}{{- content -}}{%- endgeneration -%}{%- endif -%}
{%- elif not (content is none and message['tool_calls']) -%}
{{- raise_exception('message ' ~ i ~ ' (assistant): content must be a string or {"blocks": [...]}') -}}
{%- endif -%}
{%- if message['tool_calls'] -%}
{{- check_calls(message['tool_calls'], true, decl.names, i) -}}
{%- if st.open_outputs -%}{{- ']' -}}{%- set st.open_outputs = false -%}{%- endif -%}
{%- generation -%}{{- call_list(message['tool_calls'], true) -}}{%- endgeneration -%}
{%- endif -%}
{%- elif role == 'tool' -%}
{%- if not st.in_turn -%}{{- raise_exception('message ' ~ i ~ ' (tool): tool message outside an assistant turn') -}}{%- endif -%}
{%- if content is none -%}{{- raise_exception('message ' ~ i ~ ' (tool): tool message has no content') -}}{%- endif -%}
{{- (', ' if st.open_outputs else '[') ~ tool_payload(content) -}}
{%- set st.open_outputs = true -%}
{%- elif role == 'system' -%}
{{- raise_exception('message ' ~ i ~ ' (system): a system message is only allowed at index 0') -}}
{%- else -%}
{{- raise_exception('message ' ~ i ~ ': unknown role ' ~ role) -}}
{%- endif -%}
{%- if i >= st.start -%}
{%- set blocks = content['blocks'] if (content is mapping and content['blocks'] is defined and content['blocks'] is not string) else [] -%}
{%- set st.prev_outputs = role == 'assistant' and (blocks | length) > 0 and blocks[-1] is mapping and blocks[-1]['type'] == 'tool_outputs' -%}
{%- set st.prev = role -%}
{%- endif -%}
{%- endfor -%}
{%- if st.open_outputs -%}{{- ']' -}}{%- endif -%}
{%- if st.in_turn -%}
{%- if not add_generation_prompt -%}{%- generation -%}{{- '<|assistant_end|>' -}}{%- endgeneration -%}{%- endif -%}
{%- elif add_generation_prompt -%}{{- '<|assistant_start|>' -}}
{%- endif -%}
"""

_LLAMA3 = _CONTENT_MACROS + _PLAIN_ASSISTANT_MACRO + r"""
{#- align "llama3" template (Lucie-7B style): <s>, header, text, blank line, <|eot_id|>. -#}
{{- '<s>' -}}
{%- for message in messages -%}
{%- set text = plain_text(message, loop.index0) -%}
{{- '<|start_header_id|>' ~ message['role'] ~ '<|end_header_id|>\n\n' -}}
{%- if message['role'] == 'assistant' -%}
{%- generation -%}{{- text ~ '\n\n<|eot_id|>' -}}{%- endgeneration -%}
{%- else -%}{{- text ~ '\n\n<|eot_id|>' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}{%- endif -%}
"""

_CHATML = _CONTENT_MACROS + _PLAIN_ASSISTANT_MACRO + r"""
{#- align "chatml" template: no BOS, no default system text. -#}
{%- for message in messages -%}
{%- set text = plain_text(message, loop.index0) -%}
{{- '<|im_start|>' ~ message['role'] ~ '\n' -}}
{%- if message['role'] == 'assistant' -%}
{%- generation -%}{{- text ~ '<|im_end|>' -}}{%- endgeneration -%}
{%- else -%}{{- text ~ '<|im_end|>' -}}
{%- endif -%}
{{- '\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
"""

_TEMPLATES = {"apertus": _APERTUS, "llama3": _LLAMA3, "chatml": _CHATML}


def chat_template(chat_format: str = "apertus") -> str:
    """The jinja chat template of a format (see the module docstring for its variables)."""
    return _TEMPLATES[get_format(chat_format).name].strip()
