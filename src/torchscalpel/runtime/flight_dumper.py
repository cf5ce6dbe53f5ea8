"""A launched rank's side of the NCCL flight-recorder dump: answer the launcher's request file with the dump
(:mod:`torchscalpel.runtime.hang_files` names both files; the launcher side is
:mod:`torchscalpel.distributed.flightrec`)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from torchscalpel.runtime.hang_files import nccl_dump_path, nccl_request_path


def start_flight_dumper(folder: Path, rank: int, poll_s: float = 0.5) -> threading.Thread | None:
    """On CUDA with the NCCL flight recorder: a thread that answers the launcher's dump request.

    A thread, not a signal handler: a rank stuck in an NCCL wait does not return to the interpreter's
    main loop, but the wait releases the GIL. None (nothing started) on CPU builds."""
    import torch

    dump = (
        getattr(torch._C._distributed_c10d, "_dump_nccl_trace", None)
        if hasattr(torch._C, "_distributed_c10d")
        else None
    )
    if dump is None or not torch.cuda.is_available():
        return None
    request, target = nccl_request_path(folder, rank), nccl_dump_path(folder, rank)

    def loop() -> None:
        while True:
            time.sleep(poll_s)
            if request.exists() and not target.exists():
                try:
                    data = dump()
                except Exception as exc:  # the recorder is off or the group gone: say so in the file
                    data = repr(exc).encode()
                tmp = target.with_suffix(".tmp")
                tmp.write_bytes(data)
                tmp.replace(target)

    thread = threading.Thread(target=loop, name="scalpel-nccl-dumper", daemon=True)
    thread.start()
    return thread
