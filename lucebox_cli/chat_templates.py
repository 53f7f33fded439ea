"""The chat template (Jinja text) embedded in the GGUF files lucebox writes.

Written for lucebox from the Qwen3.5 chat format (the one `tokenizer.render_qwen35_chat` renders in
Python): text roles only — system (first), user, assistant (reasoning kept only after the last real
user query), tool results grouped into one user turn — and the generation prompt with thinking on
(`<think>\n`) or off (an empty think block). A checkpoint's own `tokenizer_config.json` template,
when present, takes precedence over this one. A unit test renders both ways and compares.
"""

QWEN35_CHAT_TEMPLATE = r"""{%- set ns = namespace(last_query=-1) -%}
{%- for m in messages -%}
  {%- set c = (m.content if m.content is string else '') | trim -%}
  {%- if m.role == 'user' and not (c.startswith('<tool_response>') and c.endswith('</tool_response>')) -%}
    {%- set ns.last_query = loop.index0 -%}
  {%- endif -%}
{%- endfor -%}
{%- for m in messages -%}
  {%- set c = (m.content if m.content is string else '') | trim -%}
  {%- if m.role == 'system' -%}
    {%- if not loop.first -%}{{ raise_exception('a system message must come first') }}{%- endif -%}
    {{- '<|im_start|>system\n' + c + '<|im_end|>\n' -}}
  {%- elif m.role == 'user' -%}
    {{- '<|im_start|>user\n' + c + '<|im_end|>\n' -}}
  {%- elif m.role == 'assistant' -%}
    {%- set reasoning = '' -%}
    {%- if m.reasoning_content is string -%}
      {%- set reasoning = m.reasoning_content | trim -%}
    {%- elif '</think>' in c -%}
      {%- set reasoning = ((c.split('</think>')[0].rstrip('\n').split('<think>')[-1]).lstrip('\n')) | trim -%}
      {%- set c = c.split('</think>')[-1].lstrip('\n') -%}
    {%- endif -%}
    {%- if loop.index0 > ns.last_query -%}
      {{- '<|im_start|>assistant\n<think>\n' + reasoning + '\n</think>\n\n' + c + '<|im_end|>\n' -}}
    {%- else -%}
      {{- '<|im_start|>assistant\n' + c + '<|im_end|>\n' -}}
    {%- endif -%}
  {%- elif m.role == 'tool' -%}
    {%- if not loop.first and loop.previtem.role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
    {{- '\n<tool_response>\n' + c + '\n</tool_response>' -}}
    {%- if loop.last or loop.nextitem.role != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<|im_start|>assistant\n' -}}
  {%- if enable_thinking is defined and enable_thinking -%}{{- '<think>\n' -}}{%- else -%}{{- '<think>\n\n</think>\n\n' -}}{%- endif -%}
{%- endif -%}
"""
