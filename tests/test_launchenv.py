"""ncclbench.launch (env, claims, GPU choice, SLURM syntax) against environments real
launchers produce.

Each environment below is what a rank would see under that launcher (values as Slurm
23.x, Open MPI 4.1, MPICH 4 hydra, Intel MPI 2021 and torch 2.x torchrun set them),
trimmed of variables that cannot matter (LS_COLORS and friends)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap

import pytest

from ncclbench.launch.env import (
    DEFAULT_MASTER_PORT,
    DERIVED_PORT_BASE,
    DERIVED_PORT_SPAN,
    LaunchInfo,
    apply_to_environ,
    derived_port,
    detect,
)
from ncclbench.launch.gpus import check_gpu_for_local_rank, gpu_index_for_local_rank
from ncclbench.launch.slurm import parse_nodelist, parse_tasks_per_node
from ncclbench.launch.variables import LaunchEnvError

# ---------------------------------------------------------------------------
# Environments
# ---------------------------------------------------------------------------

LOGIN_SHELL = {
    "HOME": "/home/alice",
    "USER": "alice",
    "SHELL": "/bin/bash",
    "LANG": "en_US.UTF-8",
    "PATH": "/home/alice/venvs/bench/bin:/usr/local/cuda/bin:/usr/bin:/bin",
    "LD_LIBRARY_PATH": "/usr/local/cuda/lib64",
    "VIRTUAL_ENV": "/home/alice/venvs/bench",
    "NCCL_DEBUG": "WARN",
    "NCCL_IB_HCA": "mlx5_0,mlx5_3,mlx5_4,mlx5_5",
}

# The batch shell of `sbatch --nodes=2 --ntasks-per-node=8 --gpus-per-node=8`:
# SLURM_PROCID=0 is there, but no step id -- this shell is not a rank.
SBATCH_SHELL = {
    **LOGIN_SHELL,
    "ENVIRONMENT": "BATCH",
    "HOSTNAME": "gpu-017",
    "SLURMD_NODENAME": "gpu-017",
    "SLURM_CLUSTER_NAME": "hpc",
    "SLURM_CONF": "/etc/slurm/slurm.conf",
    "SLURM_CPUS_ON_NODE": "128",
    "SLURM_GPUS_ON_NODE": "8",
    "SLURM_GPUS_PER_NODE": "8",
    "SLURM_GTIDS": "0",
    "SLURM_JOBID": "4183207",
    "SLURM_JOB_ACCOUNT": "ml",
    "SLURM_JOB_CPUS_PER_NODE": "128(x2)",
    "SLURM_JOB_GID": "1000",
    "SLURM_JOB_GPUS": "0,1,2,3,4,5,6,7",
    "SLURM_JOB_ID": "4183207",
    "SLURM_JOB_NAME": "ncclbench",
    "SLURM_JOB_NODELIST": "gpu-[017-018]",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_JOB_PARTITION": "gpu",
    "SLURM_JOB_QOS": "normal",
    "SLURM_JOB_UID": "1000",
    "SLURM_JOB_USER": "alice",
    "SLURM_LOCALID": "0",
    "SLURM_MEM_PER_NODE": "1024000",
    "SLURM_NNODES": "2",
    "SLURM_NODEID": "0",
    "SLURM_NODELIST": "gpu-[017-018]",
    "SLURM_NPROCS": "16",
    "SLURM_NTASKS": "16",
    "SLURM_NTASKS_PER_NODE": "8",
    "SLURM_PRIO_PROCESS": "0",
    "SLURM_PROCID": "0",
    "SLURM_SUBMIT_DIR": "/home/alice/ncclbench",
    "SLURM_SUBMIT_HOST": "login01",
    "SLURM_TASKS_PER_NODE": "8(x2)",
    "SLURM_TASK_PID": "81234",
    "SLURM_TOPOLOGY_ADDR": "gpu-017",
    "SLURM_TOPOLOGY_ADDR_PATTERN": "node",
    "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
}


def srun_task(procid: int, *, nodes=("gpu-017", "gpu-018"), per_node: int = 8, step: int = 0, **extra) -> dict:
    """What `srun` (step `step`) gives task `procid` of a block-distributed step."""
    nodeid, localid = divmod(procid, per_node)
    ntasks = per_node * len(nodes)
    env = {
        **SBATCH_SHELL,
        "ENVIRONMENT": "BATCH",  # srun copies the batch shell's environment
        "HOSTNAME": nodes[nodeid],
        "SLURMD_NODENAME": nodes[nodeid],
        "SLURM_TOPOLOGY_ADDR": nodes[nodeid],
        "SLURM_CPU_BIND": "quiet,mask_cpu:0xFFFF",
        "SLURM_DISTRIBUTION": "block",
        "SLURM_GTIDS": ",".join(str(nodeid * per_node + i) for i in range(per_node)),
        "SLURM_LAUNCH_NODE_IPADDR": "10.1.0.17",
        "SLURM_LOCALID": str(localid),
        "SLURM_NODEID": str(nodeid),
        "SLURM_PROCID": str(procid),
        "SLURM_NNODES": str(len(nodes)),
        "SLURM_NPROCS": str(ntasks),
        "SLURM_NTASKS": str(ntasks),
        "SLURM_SRUN_COMM_HOST": "10.1.0.17",
        "SLURM_SRUN_COMM_PORT": "40211",
        "SLURM_STEPID": str(step),
        "SLURM_STEP_ID": str(step),
        "SLURM_STEP_GPUS": "0,1,2,3,4,5,6,7",
        "SLURM_STEP_LAUNCHER_PORT": "40211",
        "SLURM_STEP_NODELIST": "gpu-[017-018]" if len(nodes) == 2 else ",".join(nodes),
        "SLURM_STEP_NUM_NODES": str(len(nodes)),
        "SLURM_STEP_NUM_TASKS": str(ntasks),
        "SLURM_STEP_TASKS_PER_NODE": f"{per_node}(x{len(nodes)})",
        "SLURM_TASKS_PER_NODE": f"{per_node}(x{len(nodes)})",
        "SLURM_TASK_PID": str(91000 + procid),
        "SLURM_MPI_TYPE": "pmix",
        "PMIX_RANK": str(procid),
        "PMIX_NAMESPACE": "slurm.pmix.4183207.0",
    }
    env.update(extra)
    return env


SRUN_RANK9 = srun_task(9)

# `mpirun -np 16 -H gpu-a:8,gpu-b:8 ncclbench ...` (Open MPI 4.1.5), rank 11 on gpu-b.
OMPI41_RANK11 = {
    **LOGIN_SHELL,
    "HOSTNAME": "gpu-b",
    "OMPI_APP_CTX_NUM_PROCS": "16",
    "OMPI_ARGV": "allreduce -b 8 -e 128M -f 2",
    "OMPI_COMMAND": "ncclbench",
    "OMPI_COMM_WORLD_LOCAL_RANK": "3",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "8",
    "OMPI_COMM_WORLD_NODE_RANK": "3",
    "OMPI_COMM_WORLD_RANK": "11",
    "OMPI_COMM_WORLD_SIZE": "16",
    "OMPI_FIRST_RANKS": "0",
    "OMPI_MCA_ess": "^singleton",
    "OMPI_MCA_ess_base_jobid": "2847211521",
    "OMPI_MCA_ess_base_vpid": "11",
    "OMPI_MCA_initial_wdir": "/home/alice/ncclbench",
    "OMPI_MCA_orte_app_num": "0",
    "OMPI_MCA_orte_bound_at_launch": "1",
    "OMPI_MCA_orte_ess_node_rank": "3",
    "OMPI_MCA_orte_ess_num_procs": "16",
    "OMPI_MCA_orte_hnp_uri": "2847211520.0;tcp://10.1.0.11,172.17.0.1:44057",
    "OMPI_MCA_orte_launch": "1",
    "OMPI_MCA_orte_local_daemon_uri": "2847211520.1;tcp://10.1.0.12:39871",
    "OMPI_MCA_orte_num_nodes": "2",
    "OMPI_MCA_orte_precondition_transports": "5a4c6f9e01bd1f23-8b12c0d4e5f60718",
    "OMPI_MCA_orte_tmpdir_base": "/tmp",
    "OMPI_MCA_pmix": "^s1,s2,cray,isolated",
    "OMPI_MCA_shmem_RUNTIME_QUERY_hint": "mmap",
    "OMPI_NUM_APP_CTX": "1",
    "OMPI_UNIVERSE_SIZE": "16",
    "PMIX_BFROP_BUFFER_TYPE": "PMIX_BFROP_BUFFER_NON_DESC",
    "PMIX_GDS_MODULE": "ds21,ds12,hash",
    "PMIX_HOSTNAME": "gpu-b",
    "PMIX_NAMESPACE": "2847211521",
    "PMIX_PTL_MODULE": "tcp,usock",
    "PMIX_RANK": "11",
    "PMIX_SECURITY_MODE": "native",
    "PMIX_SERVER_TMPDIR": "/tmp/ompi.gpu-b.1000/pid.51732",
    "PMIX_SERVER_URI2": "2847211520.1;tcp4://127.0.0.1:38621",
    "PMIX_SERVER_URI21": "2847211520.1;tcp4://127.0.0.1:38621",
    "PMIX_SERVER_URI3": "2847211520.1;tcp4://127.0.0.1:38621",
    "PMIX_SYSTEM_TMPDIR": "/tmp",
    "PMIX_VERSION": "3.2.3",
    "IPATH_NO_BACKTRACE": "1",
    "HFI_NO_BACKTRACE": "1",
}


def ompi_single_node(rank: int, size: int = 4) -> dict:
    """`mpirun -np 4 ncclbench ...` on one workstation."""
    env = {k: v for k, v in OMPI41_RANK11.items()}
    env.update({
        "HOSTNAME": "ws01",
        "OMPI_COMM_WORLD_RANK": str(rank),
        "OMPI_COMM_WORLD_LOCAL_RANK": str(rank),
        "OMPI_COMM_WORLD_NODE_RANK": str(rank),
        "OMPI_COMM_WORLD_SIZE": str(size),
        "OMPI_COMM_WORLD_LOCAL_SIZE": str(size),
        "OMPI_UNIVERSE_SIZE": str(size),
        "OMPI_MCA_ess_base_vpid": str(rank),
        "OMPI_MCA_orte_num_nodes": "1",
        "OMPI_MCA_orte_hnp_uri": "1675821056.0;tcp://192.168.1.20:41521",
        "OMPI_MCA_ess_base_jobid": "1675821057",
        "PMIX_RANK": str(rank),
    })
    return env


# Open MPI 5 (PRRTE) across two nodes: no ORTE HNP URI, only this node's PMIx server.
OMPI5_RANK5 = {
    **LOGIN_SHELL,
    "OMPI_COMM_WORLD_RANK": "5",
    "OMPI_COMM_WORLD_SIZE": "8",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
    "OMPI_COMM_WORLD_NODE_RANK": "1",
    "OMPI_UNIVERSE_SIZE": "8",
    "OMPI_MCA_PREFIXES": "mca_,opal_,ompi_",
    "PMIX_NAMESPACE": "prterun-gpu-a-30571@1",
    "PMIX_RANK": "5",
    "PMIX_SERVER_URI41": "prterun-gpu-a-30571@0.1;tcp4://10.1.0.12:46213",
    "PMIX_SERVER_URI4": "prterun-gpu-a-30571@0.1;tcp4://10.1.0.12:46213",
    "PMIX_VERSION": "5.0.1",
}

# `mpiexec -n 4 -ppn 2 -hosts node1,node2 ncclbench ...` (MPICH 4.1 hydra), rank 2 on node2.
MPICH_HYDRA_RANK2 = {
    **LOGIN_SHELL,
    "HOSTNAME": "node2",
    "PMI_RANK": "2",
    "PMI_SIZE": "4",
    "PMI_FD": "9",
    "MPI_LOCALRANKID": "0",
    "MPI_LOCALNRANKS": "2",
    "MPIR_CVAR_CH3_INTERFACE_HOSTNAME": "node2",
}

# `mpiexec.hydra -n 2 ncclbench ...` (Intel MPI 2021.10) on one node, rank 1.
INTEL_MPI_RANK1 = {
    **LOGIN_SHELL,
    "I_MPI_ROOT": "/opt/intel/oneapi/mpi/2021.10.0",
    "I_MPI_HYDRA_TOPOLIB": "hwloc",
    "I_MPI_MPIRUN": "mpiexec.hydra",
    "I_MPI_PIN_MAPPING": "2:0 0,1 56",
    "PMI_RANK": "1",
    "PMI_SIZE": "2",
    "PMI_FD": "6",
    "MPI_LOCALRANKID": "1",
    "MPI_LOCALNRANKS": "2",
    "MPIR_CVAR_CH4_NUM_VCIS": "1",
}

# `srun -N2 --ntasks-per-node=1 torchrun --nnodes=2 --nproc-per-node=8
#   --rdzv-backend=c10d --rdzv-endpoint=gpu-017:29500 ...`: worker with global rank 13.
TORCHRUN_IN_SRUN_RANK13 = {
    **srun_task(1, per_node=1),
    "SLURM_NTASKS_PER_NODE": "1",
    "RANK": "13",
    "LOCAL_RANK": "5",
    "WORLD_SIZE": "16",
    "LOCAL_WORLD_SIZE": "8",
    "GROUP_RANK": "1",
    "GROUP_WORLD_SIZE": "2",
    "ROLE_RANK": "13",
    "ROLE_NAME": "default",
    "ROLE_WORLD_SIZE": "16",
    "MASTER_ADDR": "gpu-017",
    "MASTER_PORT": "29500",
    "TORCHELASTIC_RESTART_COUNT": "0",
    "TORCHELASTIC_MAX_RESTARTS": "0",
    "TORCHELASTIC_RUN_ID": "4183207",
    "TORCHELASTIC_USE_AGENT_STORE": "True",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    "OMP_NUM_THREADS": "1",
}

# `torchrun --standalone --nproc-per-node=4 ...` on a workstation: worker rank 2.
TORCHRUN_STANDALONE_RANK2 = {
    **LOGIN_SHELL,
    "RANK": "2",
    "LOCAL_RANK": "2",
    "WORLD_SIZE": "4",
    "LOCAL_WORLD_SIZE": "4",
    "GROUP_RANK": "0",
    "GROUP_WORLD_SIZE": "1",
    "ROLE_RANK": "2",
    "ROLE_NAME": "default",
    "ROLE_WORLD_SIZE": "4",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "47113",
    "TORCHELASTIC_RESTART_COUNT": "0",
    "TORCHELASTIC_MAX_RESTARTS": "0",
    "TORCHELASTIC_RUN_ID": "2f1c8f0e-54a1-4a6e-9d3b-6c1f0a2b7e11",
    "TORCHELASTIC_USE_AGENT_STORE": "True",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    "OMP_NUM_THREADS": "1",
}

SLURM_PORT = derived_port("slurm:4183207.0")


# ---------------------------------------------------------------------------
# detect(): who launched us, as which rank
# ---------------------------------------------------------------------------

DETECT_CASES = [
    pytest.param(LOGIN_SHELL, dict(launcher="none", rank=0, world_size=1, local_rank=0, local_world_size=1,
                                   node_rank=0, nnodes=1, master_addr=None, master_port=None),
                 id="interactive-shell"),
    pytest.param(SBATCH_SHELL, dict(launcher="none", rank=0, world_size=1, master_addr=None),
                 id="sbatch-shell-without-step-is-not-a-rank"),
    # `srun -N1 --gpus=8 --pty bash`: the one-task step is a shell to run `ncclbench -g 8` in.
    pytest.param(srun_task(0, nodes=("gpu-017",), per_node=1, SLURM_PTY_PORT="35367", SLURM_PTY_WIN_COL="203",
                           SLURM_PTY_WIN_ROW="52"),
                 dict(launcher="none", rank=0, world_size=1), id="srun-pty-interactive-shell-is-not-a-rank"),
    pytest.param(srun_task(3, SLURM_PTY_PORT="35367"), dict(launcher="slurm", rank=3, world_size=16),
                 id="srun-pty-with-many-tasks-is-still-srun"),
    pytest.param(SRUN_RANK9, dict(launcher="slurm", rank=9, world_size=16, local_rank=1, local_world_size=8,
                                  node_rank=1, nnodes=2, master_addr="gpu-017", master_port=SLURM_PORT),
                 id="srun-2x8-rank9"),
    pytest.param(srun_task(0), dict(launcher="slurm", rank=0, node_rank=0, master_addr="gpu-017",
                                    master_port=SLURM_PORT),
                 id="srun-2x8-rank0-same-master-and-port"),
    pytest.param(srun_task(9, MASTER_ADDR="10.1.0.17", MASTER_PORT="31337"),
                 dict(launcher="slurm", rank=9, master_addr="10.1.0.17", master_port=31337),
                 id="srun-honours-exported-master"),
    pytest.param(srun_task(6, nodes=("c1",), per_node=8),
                 dict(launcher="slurm", rank=6, world_size=8, local_rank=6, local_world_size=8, nnodes=1,
                      master_addr="c1"),
                 id="srun-single-node-cpu-test-cluster"),
    pytest.param(srun_task(5, SLURM_STEP_NUM_TASKS="7", SLURM_NTASKS="7", SLURM_NPROCS="7",
                           SLURM_STEP_TASKS_PER_NODE="4,3", SLURM_TASKS_PER_NODE="4,3",
                           SLURM_NODEID="1", SLURM_LOCALID="1"),
                 dict(launcher="slurm", rank=5, world_size=7, local_rank=1, local_world_size=3, node_rank=1),
                 id="srun-uneven-tasks-per-node"),
    pytest.param(srun_task(3, SLURM_STEP_TASKS_PER_NODE="", SLURM_TASKS_PER_NODE=""),
                 dict(launcher="slurm", local_world_size=8),
                 id="srun-falls-back-to-ntasks-per-node"),
    pytest.param({**srun_task(3), "SLURM_STEP_ID": "", "SLURM_STEPID": "2"},
                 dict(launcher="slurm", master_port=derived_port("slurm:4183207.2")),
                 id="srun-old-stepid-name"),
    pytest.param(OMPI41_RANK11, dict(launcher="openmpi", rank=11, world_size=16, local_rank=3, local_world_size=8,
                                     node_rank=1, nnodes=2, master_addr="10.1.0.11",
                                     master_port=derived_port("ompi:2847211521")),
                 id="openmpi41-2x8-master-from-hnp-uri"),
    pytest.param({**OMPI41_RANK11, "MASTER_ADDR": "gpu-a", "MASTER_PORT": "29555"},
                 dict(launcher="openmpi", master_addr="gpu-a", master_port=29555),
                 id="openmpi41-with-mpirun-x-master"),
    pytest.param(ompi_single_node(3), dict(launcher="openmpi", rank=3, world_size=4, local_rank=3, nnodes=1,
                                           master_addr="127.0.0.1"),
                 id="openmpi-single-node-loopback"),
    pytest.param({**OMPI5_RANK5, "MASTER_ADDR": "gpu-a"},
                 dict(launcher="openmpi", rank=5, world_size=8, local_rank=1, local_world_size=4, node_rank=1,
                      nnodes=2, master_addr="gpu-a", master_port=derived_port("ompi:prterun-gpu-a-30571@1")),
                 id="openmpi5-prrte-with-master"),
    pytest.param({**MPICH_HYDRA_RANK2, "MASTER_ADDR": "node1"},
                 dict(launcher="pmi", rank=2, world_size=4, local_rank=0, local_world_size=2, node_rank=1,
                      nnodes=2, master_addr="node1", master_port=DEFAULT_MASTER_PORT),
                 id="mpich-hydra-2x2"),
    pytest.param(INTEL_MPI_RANK1, dict(launcher="pmi", rank=1, world_size=2, local_rank=1, master_addr="127.0.0.1"),
                 id="intel-mpi-single-node"),
    pytest.param(TORCHRUN_IN_SRUN_RANK13,
                 dict(launcher="torchrun", rank=13, world_size=16, local_rank=5, local_world_size=8, node_rank=1,
                      nnodes=2, master_addr="gpu-017", master_port=29500),
                 id="torchrun-inside-srun-wins"),
    pytest.param(TORCHRUN_STANDALONE_RANK2,
                 dict(launcher="torchrun", rank=2, world_size=4, local_rank=2, local_world_size=4, nnodes=1,
                      master_addr="127.0.0.1", master_port=47113),
                 id="torchrun-standalone"),
    pytest.param({**LOGIN_SHELL, "RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29500"},
                 dict(launcher="torchrun", rank=1, world_size=2, local_rank=1, local_world_size=2,
                      master_addr="10.0.0.5"),
                 id="hand-set-env-rendezvous"),
    # srun bash -c 'RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS LOCAL_RANK=$SLURM_LOCALID ncclbench ...'
    pytest.param(srun_task(9, RANK="9", WORLD_SIZE="16", LOCAL_RANK="1"),
                 dict(launcher="slurm", rank=9, local_world_size=8, master_addr="gpu-017"),
                 id="rank-vars-mirroring-srun-are-srun"),
    # mpiexec (hydra, slurm bootstrap) starts one hydra_pmi_proxy per node with srun;
    # the ranks inherit the proxy's SLURM variables (proxy 1 of 2).
    pytest.param({**srun_task(1, per_node=1), **MPICH_HYDRA_RANK2, "PMI_RANK": "9", "PMI_SIZE": "16",
                  "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "8", "MASTER_ADDR": "gpu-017"},
                 dict(launcher="pmi", rank=9, world_size=16, local_rank=1, local_world_size=8),
                 id="hydra-proxies-started-by-srun"),
    # srun --mpi=pmi2: slurm's own PMI-2 plugin sets PMI_RANK/PMI_SIZE = SLURM's.
    pytest.param({**srun_task(9), "SLURM_MPI_TYPE": "pmi2", "PMI_RANK": "9", "PMI_SIZE": "16", "PMI_FD": "12",
                  "PMI_JOBID": "4183207.0"},
                 dict(launcher="slurm", rank=9, local_rank=1, local_world_size=8, master_addr="gpu-017",
                      master_port=SLURM_PORT),
                 id="srun-mpi-pmi2-is-slurm"),
    # mpirun inside an sbatch job: remote ranks inherit their orted's srun variables.
    pytest.param({**srun_task(0, per_node=1, SLURM_STEP_NUM_NODES="1", SLURM_STEP_NODELIST="gpu-018",
                              SLURM_STEP_NUM_TASKS="1", SLURM_NTASKS="1", SLURM_NNODES="1",
                              SLURM_NODELIST="gpu-018", SLURM_STEP_TASKS_PER_NODE="1",
                              SLURM_TASKS_PER_NODE="1"),
                  **OMPI41_RANK11},
                 dict(launcher="openmpi", rank=11, world_size=16, master_addr="10.1.0.11"),
                 id="openmpi-daemons-started-by-srun"),
]


@pytest.mark.parametrize("env, expected", DETECT_CASES)
def test_detect(env, expected):
    info = detect(env)
    got = {key: getattr(info, key) for key in expected}
    assert got == expected
    assert info.hostname == socket.gethostname()


def test_detect_reads_os_environ_by_default(monkeypatch):
    for name in list(os.environ):
        monkeypatch.delenv(name)
    for name, value in TORCHRUN_STANDALONE_RANK2.items():
        monkeypatch.setenv(name, value)
    assert detect().rank == 2


def test_detect_does_not_modify_the_mapping():
    env = dict(SRUN_RANK9)
    detect(env)
    assert env == SRUN_RANK9


def test_every_rank_of_a_step_agrees_on_master_and_port():
    infos = [detect(srun_task(rank)) for rank in range(16)]
    assert {(i.master_addr, i.master_port) for i in infos} == {("gpu-017", SLURM_PORT)}
    assert sorted((i.node_rank, i.local_rank) for i in infos) == [(n, l) for n in range(2) for l in range(8)]


def test_derived_ports_are_unprivileged_and_differ_between_jobs_and_steps():
    ports = {detect(srun_task(0, SLURM_JOB_ID=str(job), step=step)).master_port
             for job in range(4183200, 4183210) for step in range(3)}
    assert len(ports) >= 25  # collisions possible, but not many
    assert all(DERIVED_PORT_BASE <= p < DERIVED_PORT_BASE + DERIVED_PORT_SPAN for p in ports)
    assert all(p < 32768 for p in ports)  # below Linux's ephemeral range


# ---------------------------------------------------------------------------
# detect(): inconsistent environments
# ---------------------------------------------------------------------------

ERROR_CASES = [
    # RANK exported in the batch script, then copied into every task by srun.
    pytest.param(srun_task(0, RANK="1", WORLD_SIZE="2"), ["RANK=1", "SLURM_PROCID=0", "TORCHELASTIC_RUN_ID"],
                 id="stale-rank-under-srun"),
    pytest.param(srun_task(9, RANK="9", WORLD_SIZE="16", LOCAL_RANK="0"), ["LOCAL_RANK=0", "SLURM_LOCALID=1"],
                 id="stale-local-rank-under-srun"),
    pytest.param({**OMPI41_RANK11, "RANK": "0", "WORLD_SIZE": "16"}, ["RANK=0", "OMPI_COMM_WORLD_RANK=11"],
                 id="stale-rank-under-mpirun"),
    pytest.param({**OMPI41_RANK11, "PMI_RANK": "3", "PMI_SIZE": "16"},
                 ["OMPI_COMM_WORLD_RANK=11", "PMI_RANK=3"], id="openmpi-and-pmi-disagree"),
    pytest.param({**LOGIN_SHELL, "RANK": "0"}, ["RANK", "WORLD_SIZE is missing"], id="rank-without-world-size"),
    pytest.param({**LOGIN_SHELL, "WORLD_SIZE": "4"}, ["WORLD_SIZE", "RANK is missing"], id="world-size-without-rank"),
    pytest.param({**LOGIN_SHELL, "TORCHELASTIC_RUN_ID": "x"}, ["TORCHELASTIC_RUN_ID", "RANK and WORLD_SIZE"],
                 id="torchelastic-without-rank"),
    pytest.param({**TORCHRUN_STANDALONE_RANK2, "RANK": "4"}, ["RANK=4 is not below WORLD_SIZE=4"],
                 id="rank-not-below-world-size"),
    pytest.param({**TORCHRUN_STANDALONE_RANK2, "RANK": "-1"}, ["RANK=-1 is negative"], id="negative-rank"),
    pytest.param({**TORCHRUN_STANDALONE_RANK2, "RANK": "two"}, ["RANK='two' is not an integer"], id="non-integer"),
    pytest.param({**TORCHRUN_STANDALONE_RANK2, "WORLD_SIZE": "0", "RANK": "0"}, ["WORLD_SIZE=0"], id="zero-world"),
    pytest.param({**TORCHRUN_STANDALONE_RANK2, "LOCAL_RANK": "4"}, ["LOCAL_RANK=4 is not below LOCAL_WORLD_SIZE=4"],
                 id="local-rank-not-below-local-size"),
    pytest.param({**TORCHRUN_STANDALONE_RANK2, "LOCAL_WORLD_SIZE": "8"}, ["LOCAL_WORLD_SIZE=8", "WORLD_SIZE=4"],
                 id="local-size-larger-than-world"),
    pytest.param({**TORCHRUN_STANDALONE_RANK2, "MASTER_PORT": "70000"}, ["MASTER_PORT=70000"], id="port-too-big"),
    pytest.param({**TORCHRUN_STANDALONE_RANK2, "MASTER_PORT": "0"}, ["MASTER_PORT=0"], id="port-zero-multi-rank"),
    pytest.param(srun_task(8, SLURM_LOCALID="8"), ["SLURM_LOCALID=8", "SLURM_STEP_TASKS_PER_NODE[1]=8"],
                 id="slurm-localid-out-of-range"),
    pytest.param(srun_task(3, SLURM_STEP_TASKS_PER_NODE="8,4"), ["SLURM_STEP_TASKS_PER_NODE='8,4'", "12",
                                                                 "SLURM_STEP_NUM_TASKS=16"],
                 id="slurm-tasks-per-node-sum"),
    pytest.param(srun_task(3, SLURM_STEP_NODELIST="gpu-[017-019]"), ["SLURM_STEP_NODELIST", "3 hosts",
                                                                     "SLURM_STEP_NUM_NODES=2"],
                 id="slurm-nodelist-count"),
    pytest.param(srun_task(3, SLURM_STEP_NODELIST="gpu-[017-018"), ["SLURM_STEP_NODELIST", "unbalanced"],
                 id="slurm-bad-nodelist"),
    pytest.param(srun_task(3, SLURM_STEP_TASKS_PER_NODE="8(2)"), ["SLURM_STEP_TASKS_PER_NODE='8(2)'"],
                 id="slurm-bad-tasks-per-node"),
    pytest.param({k: v for k, v in SRUN_RANK9.items() if k != "SLURM_LOCALID"}, ["SLURM_LOCALID is missing"],
                 id="slurm-step-without-localid"),
    pytest.param({k: v for k, v in OMPI41_RANK11.items() if k != "OMPI_COMM_WORLD_LOCAL_SIZE"},
                 ["OMPI_COMM_WORLD_LOCAL_SIZE is missing"], id="openmpi-without-local-size"),
    pytest.param({k: v for k, v in MPICH_HYDRA_RANK2.items() if k != "MPI_LOCALNRANKS"},
                 ["MPI_LOCALRANKID is set but MPI_LOCALNRANKS is missing"], id="hydra-half-local-vars"),
    pytest.param({k: v for k, v in OMPI41_RANK11.items() if k != "OMPI_MCA_orte_hnp_uri"},
                 ["openmpi", "OMPI_COMM_WORLD_SIZE=16", "export MASTER_ADDR"], id="openmpi-multi-node-no-master"),
    pytest.param(OMPI5_RANK5, ["export MASTER_ADDR"], id="openmpi5-multi-node-no-master"),
    pytest.param(MPICH_HYDRA_RANK2, ["pmi", "PMI_SIZE=4", "export MASTER_ADDR"], id="hydra-multi-node-no-master"),
]


@pytest.mark.parametrize("env, fragments", ERROR_CASES)
def test_detect_rejects_inconsistent_environments(env, fragments):
    with pytest.raises(LaunchEnvError) as caught:
        detect(env)
    message = str(caught.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message


def test_launch_env_error_is_a_plain_exception():
    assert issubclass(LaunchEnvError, Exception)


# ---------------------------------------------------------------------------
# detect(): explicit CLI options
# ---------------------------------------------------------------------------

def test_explicit_rank_and_world_size_without_launcher():
    info = detect(LOGIN_SHELL, explicit={"rank": 1, "world_size": 2, "master_addr": None, "master_port": None})
    assert (info.launcher, info.rank, info.world_size, info.local_rank, info.local_world_size) == \
        ("explicit", 1, 2, 1, 2)
    assert (info.master_addr, info.master_port) == ("127.0.0.1", DEFAULT_MASTER_PORT)


def test_explicit_master_overrides_environment_but_keeps_launcher():
    info = detect({**SRUN_RANK9, "MASTER_ADDR": "10.9.9.9"}, explicit={"master_addr": "gpu-018", "master_port": 23456})
    assert (info.launcher, info.rank, info.master_addr, info.master_port) == ("slurm", 9, "gpu-018", 23456)


def test_explicit_rank_overrides_launcher_field_by_field():
    info = detect(SRUN_RANK9, explicit={"rank": 3})
    assert (info.launcher, info.rank, info.world_size, info.local_rank) == ("explicit", 3, 16, 1)


@pytest.mark.parametrize("explicit, fragment", [
    ({"rank": 1}, "--world-size"),
    ({"world_size": 4}, "--rank"),
    ({"rank": 4, "world_size": 4}, "--rank=4 is not below --world-size=4"),
    ({"rank": -1, "world_size": 4}, "--rank=-1 is negative"),
    ({"rank": "x", "world_size": 4}, "--rank='x' is not an integer"),
])
def test_explicit_errors(explicit, fragment):
    with pytest.raises(LaunchEnvError, match=fragment):
        detect(LOGIN_SHELL, explicit=explicit)


def test_explicit_world_size_one_implies_rank_zero():
    assert detect(LOGIN_SHELL, explicit={"world_size": 1}).rank == 0


def test_explicit_unknown_key():
    with pytest.raises(ValueError, match="ranks"):
        detect(LOGIN_SHELL, explicit={"ranks": 2})


# ---------------------------------------------------------------------------
# apply_to_environ()
# ---------------------------------------------------------------------------

def test_apply_fills_only_missing_variables():
    env = dict(OMPI41_RANK11)
    info = detect(env)
    changed = apply_to_environ(info, env)
    assert changed == {"RANK": "11", "WORLD_SIZE": "16", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "8",
                       "MASTER_ADDR": "10.1.0.11", "MASTER_PORT": str(info.master_port)}
    # Once applied, detecting again gives the same answer (the RANK variables now mirror
    # Open MPI's), and applying again changes nothing.
    assert detect(env) == info
    assert apply_to_environ(info, env) == {}


def test_apply_keeps_torchrun_variables():
    env = dict(TORCHRUN_IN_SRUN_RANK13)
    assert apply_to_environ(detect(env), env) == {}
    assert env == TORCHRUN_IN_SRUN_RANK13


def test_apply_refuses_to_contradict_a_set_variable():
    env = {**SRUN_RANK9, "LOCAL_RANK": "0"}  # stale, exported in the batch script
    info = detect(SRUN_RANK9)
    with pytest.raises(LaunchEnvError, match="LOCAL_RANK=0 is already set but this process is LOCAL_RANK=1"):
        apply_to_environ(info, env)


def test_apply_overwrite_for_explicit_options():
    env = dict(TORCHRUN_STANDALONE_RANK2)
    info = detect(env, explicit={"master_port": 40000})
    with pytest.raises(LaunchEnvError, match="MASTER_PORT"):
        apply_to_environ(info, dict(env))
    assert apply_to_environ(info, env, overwrite=True) == {"MASTER_PORT": "40000"}
    assert env["MASTER_PORT"] == "40000"


def test_apply_for_a_lone_process_uses_loopback_and_any_port():
    env = dict(LOGIN_SHELL)
    apply_to_environ(detect(env), env)
    assert (env["RANK"], env["WORLD_SIZE"], env["MASTER_ADDR"], env["MASTER_PORT"]) == ("0", "1", "127.0.0.1", "0")


def test_apply_refuses_a_multi_rank_world_without_master():
    info = LaunchInfo("explicit", 0, 2, 0, 2, 0, 1, None, None, "h")
    with pytest.raises(LaunchEnvError, match="2 ranks"):
        apply_to_environ(info, {})


RANK_SCRIPT = textwrap.dedent("""
    import os, torch, torch.distributed as dist
    from ncclbench.launch.env import detect, apply_to_environ
    info = detect()
    apply_to_environ(info, os.environ)
    dist.init_process_group("gloo", init_method="env://")
    t = torch.tensor([float(info.rank + 1)])
    dist.all_reduce(t)
    print(info.launcher, dist.get_rank(), dist.get_world_size(), int(t.item()), flush=True)
    dist.destroy_process_group()
""")


def _run_ranks(envs: list[dict]) -> list[str]:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    procs = [subprocess.Popen([sys.executable, "-c", RANK_SCRIPT], env={**env, "PYTHONPATH": root},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for env in envs]
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        outputs.append(out.strip())
    return outputs


def _base_env() -> dict:
    keep = ("PATH", "HOME", "LANG", "TMPDIR", "LD_LIBRARY_PATH")
    return {k: os.environ[k] for k in keep if k in os.environ}


@pytest.mark.slow
def test_env_rendezvous_works_for_a_lone_process():
    assert _run_ranks([_base_env()]) == ["none 0 1 1"]


@pytest.mark.slow
def test_env_rendezvous_works_from_srun_variables():
    """Two 'srun tasks' on this host: master and port come from the node list and job id."""
    job = str(7_000_000 + os.getpid())  # a fresh port per test run
    envs = [{**_base_env(), **{k: v for k, v in srun_task(rank, nodes=("localhost",), per_node=2,
                                                           SLURM_JOB_ID=job, SLURM_JOBID=job).items()
                               if k.startswith(("SLURM", "PMIX"))}} for rank in range(2)]
    assert _run_ranks(envs) == ["slurm 0 2 3", "slurm 1 2 3"]


# ---------------------------------------------------------------------------
# GPU choice
# ---------------------------------------------------------------------------

def _info(local_rank: int, local_world_size: int = 8) -> LaunchInfo:
    return LaunchInfo("slurm", local_rank, local_world_size, local_rank, local_world_size, 0, 1,
                      "gpu-017", 29500, "gpu-017")


def test_gpu_for_local_rank():
    assert gpu_index_for_local_rank(_info(3), 8, {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}) == 3
    check_gpu_for_local_rank(_info(3), 8, {})


def test_no_gpu_for_local_rank():
    env = {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    with pytest.raises(LaunchEnvError) as caught:
        check_gpu_for_local_rank(_info(5), 4, env)
    assert str(caught.value).startswith("local rank 5 has no GPU: only 4 visible (CUDA_VISIBLE_DEVICES=0,1,2,3)")
    with pytest.raises(LaunchEnvError, match=r"only 1 visible \(CUDA_VISIBLE_DEVICES=unset\)"):
        check_gpu_for_local_rank(_info(1, 2), 1, {})
    with pytest.raises(LaunchEnvError, match="only 0 visible"):
        check_gpu_for_local_rank(_info(0, 1), 0, {"CUDA_VISIBLE_DEVICES": ""})


def test_one_gpu_bound_per_task():
    # srun --gpus-per-task=1 / torchrun virtual local ranks: each task sees just its GPU.
    assert gpu_index_for_local_rank(_info(5), 1, {"CUDA_VISIBLE_DEVICES": "5"}) == 0
    assert gpu_index_for_local_rank(_info(5), 1, {"CUDA_VISIBLE_DEVICES": "GPU-8e3c4b1e-7d55-4f5f"}) == 0


# ---------------------------------------------------------------------------
# SLURM syntax
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("text, hosts", [
    ("gpu[01-04,07]", ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07"]),
    ("a[1-2],b3", ["a1", "a2", "b3"]),
    ("rack1-n[001-003]", ["rack1-n001", "rack1-n002", "rack1-n003"]),
    ("gpu-[017-018]", ["gpu-017", "gpu-018"]),
    ("node7", ["node7"]),
    ("node[8-10]", ["node8", "node9", "node10"]),
    ("n[08-10]", ["n08", "n09", "n10"]),
    ("n[1-2]-ib", ["n1-ib", "n2-ib"]),
    ("r[1-2]-n[01-02]", ["r1-n01", "r1-n02", "r2-n01", "r2-n02"]),
    ("dgx[3,1]", ["dgx3", "dgx1"]),
    ("login01,gpu[1-2],cpu-x", ["login01", "gpu1", "gpu2", "cpu-x"]),
    ("node001.cluster.example.org", ["node001.cluster.example.org"]),
])
def test_parse_nodelist(text, hosts):
    assert parse_nodelist(text) == hosts


@pytest.mark.parametrize("text", ["", "  ", "gpu[01-04", "gpu]01[", "gpu[]", "gpu[[1]]", "gpu[4-1]",
                                  "gpu[a-b]", "a,,b", "a, b", "n[1-200000]", "r[1-1000]-n[1-1000]"])
def test_parse_nodelist_rejects(text):
    with pytest.raises(ValueError):
        parse_nodelist(text)


def test_parse_nodelist_without_python_hostlist_is_one_clear_error(monkeypatch):
    """Installed with --no-deps, ncclbench still runs everywhere but a SLURM step, which
    says what is missing."""
    monkeypatch.setitem(sys.modules, "hostlist", None)  # import hostlist -> ImportError
    with pytest.raises(LaunchEnvError, match="needs the python-hostlist package"):
        parse_nodelist("gpu[01-02]")


@pytest.mark.parametrize("text, counts", [
    ("8(x2)", [8, 8]),
    ("4,3", [4, 3]),
    ("2(x3),1", [2, 2, 2, 1]),
    ("8", [8]),
    ("1(x4)", [1, 1, 1, 1]),
])
def test_parse_tasks_per_node(text, counts):
    assert parse_tasks_per_node(text) == counts


@pytest.mark.parametrize("text", ["", "x", "8(2)", "8(x2", "8(x0)", "4,,3", "-1", "8x2"])
def test_parse_tasks_per_node_rejects(text):
    with pytest.raises(ValueError):
        parse_tasks_per_node(text)
