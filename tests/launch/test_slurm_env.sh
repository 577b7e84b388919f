#!/usr/bin/env bash
# fulgur env and fulgur fit under SLURM's variables (as srun sets them for
# task 1 of 2 nodes x 2 tasks), without a cluster: what it read, what it
# derived as Lightning's SLURMEnvironment does (master = the node list's
# first host, port = 15000 + the job id's last 4 digits), the plan, and the
# refusals that name both values when they disagree.
source "$(dirname "$0")/../cli/lib.sh"
echo "test_slurm_env: SLURM's variables into the job contract"
unset $(env | grep -o '^SLURM_[A-Z_]*') RANK WORLD_SIZE FULGUR_RANK OMPI_COMM_WORLD_RANK 2>/dev/null
S=(env SLURM_PROCID=1 SLURM_LOCALID=1 SLURM_NODEID=0 SLURM_NTASKS=4 SLURM_NNODES=2
   SLURM_TASKS_PER_NODE='2(x2)' SLURM_NTASKS_PER_NODE=2 SLURM_JOB_NODELIST='gpu[07-08]'
   SLURM_JOB_ID=4711234 SLURM_JOB_NAME=train)
run env1 "${S[@]}" "$FULGUR" env --devices 2 --num-nodes 2 --strategy ddp
expect_rc "fulgur env under srun's variables" 0 env1
expect_grep "the source is slurm" env1 '^cluster environment: +slurm$'
expect_grep "rank, local rank, node" env1 'rank 1 of 4, local rank 1 of 2, node 0 of 2'
expect_grep "master from the node list, Lightning's port" env1 'master gpu07:16234$'
expect_grep "says how it derived them" env1 'derived: master gpu07: the first host of SLURM_JOB_NODELIST; port 16234: 15000 \+ the last 4 digits of SLURM_JOB_ID'
expect_grep "the node list expanded, this node marked" env1 'nodes gpu\[07-08\] = gpu07 \(this node\) gpu08$'
expect_grep "the plan: 2 per node x 2 nodes" env1 'launch plan: +ddp on cpu, 4 ranks \(2 per node x 2 nodes.*slurm, this process is rank 1'
run env2 "${S[@]}" "$FULGUR" env --devices 1 --num-nodes 2 --strategy ddp
expect_rc "devices that disagree with the tasks per node" 2 env2
expect_grep "names both, as Lightning's check" env2 'devices=1, but SLURM started 2 tasks on this node: set #SBATCH --ntasks-per-node=1'
run env3 "${S[@]}" "$FULGUR" env --devices 2 --num-nodes 3 --strategy ddp
expect_rc "num_nodes that disagree with the job's" 2 env3
expect_grep "names the job's node count" env3 "num_nodes=3, but SLURM's job has 2 nodes"
run env4 "${S[@]}" SLURM_JOB_NODELIST='gpu[07-09]' "$FULGUR" env
expect_rc "a node list of 3 hosts for 2 nodes" 1 env4
expect_grep "names both variables" env4 'invalid: SLURM_JOB_NODELIST="gpu\[07-09\]" names 3 hosts, but SLURM_NNODES=2'
run env5 "${S[@]}" SLURM_JOB_NAME=bash "$FULGUR" env
expect_grep "salloc's shell is no launch" env5 '^cluster environment: +none \(not launched\)'
finish
