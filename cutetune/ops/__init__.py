"""The torch-facing public ops: one declaration per op (registry.OpDef) in a module of its own,
served by one path (serve.py). Importing this package imports every module in it, so that each
op registers itself, its route and its torch.library custom ops (torch.ops.cutetune.*)."""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
