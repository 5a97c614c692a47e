"""A small GPT trained with torchft 0.2.0: train.py (plain torch DDP) on
torchft's Manager, its DistributedDataParallel and OptimizerWrapper, for
`make bench-torchft` (hack/bench-torchft.py) to compare with
train_elastic.py. One process per replica group (REPLICA_GROUP_ID of
NUM_REPLICA_GROUPS); the lighthouse (`torchft_lighthouse`) at
$TORCHFT_LIGHTHOUSE; a replica group's TCPStore at MASTER_ADDR:MASTER_PORT,
hosted here when the group is this one process (WORLD_SIZE=1, no torchrun).

torchft's knobs for finding a failure, as 0.2.0 has them: the Manager's
`timeout` (collectives, should_commit, checkpoint transfer; env
TORCHFT_TIMEOUT_SEC, default 60 s), `quorum_timeout` (TORCHFT_QUORUM_TIMEOUT_SEC,
60 s), `connect_timeout` (TORCHFT_CONNECT_TIMEOUT_SEC, 60 s), the manager's
heartbeat to the lighthouse (100 ms), and the lighthouse's
`--join_timeout_ms` (how long a quorum waits for more replicas once
`--min_replicas` joined) and `--heartbeat_timeout_ms` (how long a replica
may be silent). A recovering replica takes the state from a peer (torchft's
HTTP checkpoint transport); TORCHFT_MIN_REPLICAS (1) is min_replica_size.

TORCHFT_PG=baby uses ProcessGroupBabyGloo (gloo in a subprocess) and
TORCHFT_DDP=pure PureDistributedDataParallel (one all-reduce a gradient)
instead of ProcessGroupGloo and DistributedDataParallel.

The loop is train.py's, with torchft's order: zero_grad() starts the step's
quorum, the rank and world are then the quorum's (the step's share of the
global batch, as train.py splits it), the step is the Manager's, and a step
is logged only when it was committed."""

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torchft import DistributedDataParallel, Manager, ProcessGroupGloo
from torchft.ddp import PureDistributedDataParallel
from torchft.optim import OptimizerWrapper
from torchft.process_group import ProcessGroupBabyGloo

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt import GPT, args, batch, corpus, evaluate, log, lr_at  # noqa: E402


def seconds(name, default):
    return timedelta(seconds=float(os.environ.get(name, default)))


def main():
    a = args()
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    data = corpus()
    if os.environ.get("WORLD_SIZE", "1") == "1":
        # the replica group's store, which torchrun's agent would host
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=True,  # noqa: F841
                              wait_for_workers=False)
    model = GPT(a)
    inner = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.1)

    def state_dict():
        return {"model": model.state_dict(), "optim": inner.state_dict()}

    def load_state_dict(got):
        model.load_state_dict(got["model"])
        inner.load_state_dict(got["optim"])

    timeout = seconds("TORCHFT_TIMEOUT_SEC", "60")
    # TORCHFT_PG=baby runs gloo in a subprocess (torchft's ProcessGroupBabyGloo)
    pg = (ProcessGroupBabyGloo if os.environ.get("TORCHFT_PG") == "baby" else ProcessGroupGloo)(timeout=timeout)
    manager = Manager(pg=pg, load_state_dict=load_state_dict, state_dict=state_dict,
                      min_replica_size=int(os.environ.get("TORCHFT_MIN_REPLICAS", "1")), timeout=timeout,
                      quorum_timeout=seconds("TORCHFT_QUORUM_TIMEOUT_SEC", "60"),
                      connect_timeout=seconds("TORCHFT_CONNECT_TIMEOUT_SEC", "60"),
                      replica_id="gpt_%s" % os.environ.get("REPLICA_GROUP_ID", "0"), init_sync=False)
    # TORCHFT_DDP=pure: torchft's PureDistributedDataParallel (an all-reduce a
    # gradient, no buckets) instead of its DistributedDataParallel
    ddp = (PureDistributedDataParallel if os.environ.get("TORCHFT_DDP") == "pure" else DistributedDataParallel)(manager, model)
    opt = OptimizerWrapper(manager, inner)
    while manager.current_step() < a.steps:
        opt.zero_grad()  # starts the quorum of this step
        step = manager.current_step()
        rank, world = manager.participating_rank(), manager.num_participants()
        x, y = batch(data, a, step, rank or 0, max(world, 1))
        for group in opt.param_groups:
            group["lr"] = lr_at(a, step)
        loss = ddp(x, y)
        loss.backward()
        opt.step()
        if manager.current_step() > step:  # committed; a healed replica jumps to the quorum's step
            log(manager.current_step(), rank or 0, world, loss)
    if manager.participating_rank() == 0:
        print("final loss=%.4f steps=%d" % (evaluate(model, data, a), a.steps), flush=True)
    manager.shutdown(wait=False)
    os._exit(0)


if __name__ == "__main__":
    main()
