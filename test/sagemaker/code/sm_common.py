"""What the SageMaker test scripts share: the model, the data, the steps, and
the evidence each rank leaves for test/sagemaker/check.py.

Every rank builds the same model from one seed and draws its own batches, so
any two jobs of the same world size whose gradients are summed by smddp end
with the same parameters, bit for bit: the documented script styles are
compared that way.
"""

import collections
import ctypes
import hashlib
import json
import os
import socket
import tempfile

import torch

STEPS = 6


def train(wrap, rank: int) -> torch.nn.Module:
    """Trains a small MLP wrapped by wrap (a DistributedDataParallel) for STEPS steps."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    ddp = wrap(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1000 + rank)
    for step in range(STEPS):
        x = torch.randn(32, 16, generator=gen)
        loss = torch.nn.functional.mse_loss(ddp(x), x.sum(dim=1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0:
            print(f"step {step + 1} loss {loss.item():.6f}", flush=True)
    return model


def _libc_getenv(name: str):
    """The variable as the C library sees it now (libsmddp may have changed it)."""
    value = ctypes.CDLL(None).getenv
    value.restype = ctypes.c_char_p
    got = value(name.encode())
    return got.decode() if got is not None else None


def report(model: torch.nn.Module, style: str) -> None:
    """Writes this rank's evidence to SM_OUTPUT_DATA_DIR/evidence-r<rank>.json."""
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().contiguous().numpy().tobytes())
    hosts = [None] * world
    dist.all_gather_object(hosts, socket.gethostname())
    digests = [None] * world
    dist.all_gather_object(digests, digest.hexdigest())
    evidence = {
        "style": style,
        "rank": rank,
        "world": world,
        "backend": dist.get_backend(),
        "host": socket.gethostname(),
        "hosts": hosts,
        "params_sha256": digest.hexdigest(),
        "params_agree": len(set(digests)) == 1,
        "env": {k: os.environ.get(k) for k in (
            "USE_SMDDP_COLLECTIVES", "SMDDP_COMMUNICATION_BACKEND", "LD_PRELOAD", "MASTER_ADDR",
            "MASTER_PORT", "LOCAL_RANK", "SMDATAPARALLEL_LOCAL_RANK", "FI_PROVIDER")},
        "fi_provider_now": _libc_getenv("FI_PROVIDER"),
    }
    if evidence["backend"] == "smddp":
        import smddp

        evidence["stats_ops"] = smddp.stats()["ops"]
        with tempfile.TemporaryDirectory() as tmp:
            with open(smddp.dump_trace(path=os.path.join(tmp, "trace.json"))) as f:
                trace = json.load(f)
        evidence["trace_kinds"] = dict(collections.Counter(op["kind"] for op in trace["ops"]))
    out = os.environ.get("SM_OUTPUT_DATA_DIR", ".")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"evidence-r{rank}.json"), "w") as f:
        json.dump(evidence, f, indent=1)
    print(f"rank {rank}: {style}, backend {evidence['backend']}, params {digest.hexdigest()[:16]}",
          flush=True)
