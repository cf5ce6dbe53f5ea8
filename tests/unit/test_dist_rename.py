"""``torchscalpel.dist`` still imports, with a warning, as the very same modules as ``torchscalpel.distributed``."""

from __future__ import annotations

import subprocess
import sys

from helpers import cli_env


def test_the_old_name_warns_and_aliases_the_new_modules() -> None:
    code = (
        "import warnings\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    import torchscalpel.dist as old\n"
        "    from torchscalpel.dist.wrap import wrap as old_wrap\n"
        "import torchscalpel.distributed as new\n"
        "from torchscalpel.distributed.wrap import wrap\n"
        "assert old_wrap is wrap and old.Checkpointer is new.Checkpointer\n"
        "import sys; assert sys.modules['torchscalpel.dist.wrap'] is sys.modules['torchscalpel.distributed.wrap']\n"
        "assert any(issubclass(x.category, DeprecationWarning) and 'torchscalpel.distributed' in str(x.message) for x in w)\n"
        "print('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=cli_env(), capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
