"""Where kforge's doit commands were before they moved to kforge.edge.commands: a project's pyproject.toml that
still names this module gets one line saying what to write instead, not doit's traceback."""
import sys

sys.stderr.write("kforge: pyproject.toml's [tool.doit.plugins.command] names kforge.doit_commands, which is now "
                 "kforge.edge.commands: write `forget = \"kforge.edge.commands:Forget\"` (and info, clean, prune, "
                 "cache the same way), as kforge's own pyproject.toml does\n")
raise SystemExit(2)
