#!/usr/bin/env python3
"""gen_semantics_cases.py — regenerate semantics_cases.json: every line of
semantics_snippets.txt (a template; the two characters \\n stand for a
newline) rendered with Python jinja2 configured as Hugging Face transformers
configures it (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
loopcontrols, tojson = json.dumps(ensure_ascii=False, ...), raise_exception,
strftime_now on a fixed clock) and the CONTEXT below; then every line of
semantics_json_snippets.txt ("CONTEXT-JSON<TAB>template") rendered with
json.loads(CONTEXT-JSON), recorded with that text as "context_json" (the
test renders it with cmf_template_render_json: exact numbers such as ints
beyond 64 bits). Run with Debian's python3-jinja2:
/usr/bin/python3 tests/chat/gen_semantics_cases.py
"""
import datetime
import json
import os

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

CONTEXT = {
    "messages": [
        {"role": "system", "content": "  Sys  "},
        {"role": "user", "content": "Héllo wörld, how are you?"},
        {"role": "assistant", "content": "<think>hmm</think>Fine",
         "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1, "y": [1.5, "a"]}}}]},
    ],
    "tools": None, "n": 5, "f": 2.5, "s": "a,b,,c", "d": {"b": 2, "a": 1, "C": 3},
    "l": [3, 1, 2], "words": ["Banana", "apple", "cherry"], "e": "",
}


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def strftime_now(fmt):
    return datetime.datetime(2025, 7, 10, 12, 0, 0).strftime(fmt)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    cases = []
    with open(os.path.join(here, "semantics_snippets.txt"), encoding="utf-8") as f:
        for i, line in enumerate(l.rstrip("\n") for l in f):
            if not line.strip():
                continue
            tpl = line.replace("\\n", "\n")
            case = {"name": f"line{i + 1}", "template": tpl}
            try:
                case["jinja2_reference"] = {"output": env.from_string(tpl).render(**CONTEXT)}
            except Exception as ex:  # the engine must fail too
                case["jinja2_reference"] = {"error": repr(ex)}
            cases.append(case)
    with open(os.path.join(here, "semantics_json_snippets.txt"), encoding="utf-8") as f:
        for i, line in enumerate(l.rstrip("\n") for l in f):
            if not line.strip():
                continue
            ctx, tpl = line.split("\t", 1)
            tpl = tpl.replace("\\n", "\n")
            case = {"name": f"json_line{i + 1}", "template": tpl, "context_json": ctx}
            try:
                case["jinja2_reference"] = {"output": env.from_string(tpl).render(**json.loads(ctx))}
            except Exception as ex:  # the engine must fail too
                case["jinja2_reference"] = {"error": repr(ex)}
            cases.append(case)
    out = {"generator": f"gen_semantics_cases.py, jinja2 {jinja2.__version__}", "context": CONTEXT, "cases": cases}
    with open(os.path.join(here, "semantics_cases.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
