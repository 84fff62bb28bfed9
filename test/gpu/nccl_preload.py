"""torch's NCCL backend under a preloaded libsmddp (the `auto` mode's preload).

Starts itself again with LD_PRELOAD=<libsmddp.so> and USE_SMDDP_COLLECTIVES=1
(as smddprun does under auto), runs all_reduce, all_gather_into_tensor and
reduce_scatter_tensor with backend="nccl" on one rank (NCCL refuses two ranks
on one GPU), checks the results, and checks from the child's log that smddp
served the calls rather than NCCL. Prints PASS or FAIL; exit status 0 on PASS.

    python3 test/gpu/nccl_preload.py path/to/libsmddp.so
"""

import os
import subprocess
import sys


def child():
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:%s" % os.environ["PORT"],
                            rank=0, world_size=1, device_id=torch.device("cuda", 0))
    x = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
    y = x.clone()
    dist.all_reduce(y)
    out = torch.empty_like(x)
    dist.all_gather_into_tensor(out, x)
    rs = torch.empty_like(x)
    dist.reduce_scatter_tensor(rs, x)
    ok = torch.equal(y, x) and torch.equal(out, x) and torch.equal(rs, x)
    dist.destroy_process_group()
    print("results", "ok" if ok else "WRONG")


def main():
    if len(sys.argv) == 1:
        return child()
    lib = os.path.abspath(sys.argv[1])
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, LD_PRELOAD=lib, USE_SMDDP_COLLECTIVES="1",
               SMDDP_COMMUNICATION_BACKEND="auto", SMDDP_DEBUG="INFO", PORT=str(port))
    r = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True,
                       timeout=120)
    served = "are served by smddp" in r.stderr
    ok = r.returncode == 0 and "results ok" in r.stdout and served
    sys.stdout.write(r.stdout)
    lines = [ln for ln in r.stderr.splitlines() if "smddp" in ln or "Error" in ln]
    sys.stdout.write("\n".join(lines[-15:]) + "\n")
    print("PASS" if ok else "FAIL", ": torch's nccl backend with libsmddp preloaded; smddp served "
          "its calls:", served)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
