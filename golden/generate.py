#!/usr/bin/env python
"""Regenerates every golden fixture of wanbake.

Run from the repository root:

    /work/pyenv/bin/python golden/generate.py

The WAN fixtures come from `wan_golden.main()`. The Stable Audio 3 and Qwix fixtures come from
`sa3_golden.main()` and `qwix_golden.main()` when those modules are present (they are written
by another helper); a missing module is skipped with a printed note.

The script re-executes itself with PYTHONHASHSEED=0 when that is not already set: PEFT keeps
`target_modules` in a Python set and diffusers turns that set into a JSON list, so the
order of names inside adapter_config.json / lora_adapter_metadata depends on string hashing.
With a fixed hash seed two runs produce byte-identical files.
"""

import importlib
import os
import sys


def _reexec_with_fixed_hash_seed() -> None:
    if os.environ.get("PYTHONHASHSEED") == "0":
        return
    env = dict(os.environ, PYTHONHASHSEED="0")
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


def _run_optional(module_name: str) -> None:
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name != module_name:
            raise
        print(f"[generate] note: {module_name}.py not found next to generate.py; skipping it")
        return
    print(f"[generate] running {module_name}.main()")
    module.main()


def main() -> None:
    _reexec_with_fixed_hash_seed()
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    only = set(sys.argv[1:])
    if not only or "wan" in only:
        wan_golden = importlib.import_module("wan_golden")
        print("[generate] running wan_golden.main()")
        wan_golden.main()
    if not only or "sa3" in only:
        _run_optional("sa3_golden")
    if not only or "qwix" in only:
        _run_optional("qwix_golden")


if __name__ == "__main__":
    main()
