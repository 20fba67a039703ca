"""laplax.supervisor's parsing of JAX's runtime abort (the texts jax 0.10.2 printed in this
project's host-fault runs) and of --multihost; the processes themselves: test_multihost.py."""

from laplax import supervisor

# The survivor's FATAL block after kill -9 of process 1 (heartbeat timeout)...
WORKER_LOST = """F1202 16:17:00.094083   11758 client.h:80] Terminating process because the JAX \
distributed service detected fatal errors. This most likely indicates that another task died; \
see the other task logs for more details. absl::Status: UNAVAILABLE: The following tasks are \
unhealthy (stopped sending heartbeats):
1
The tasks have crashed. Check the task logs for an earlier error, or scheduler events (e.g. \
preemption, eviction) to debug further.

RPC: /xla.coordination.CoordinationService/PollForError \
[type.googleapis.com/tensorflow.CoordinationServiceError='']
"""
# ... after kill -9 of the coordinator (its socket closed) ...
COORDINATOR_GONE = """F1202 16:17:31.113069   13145 client.h:80] Terminating process because \
the JAX distributed service detected fatal errors. absl::Status: UNAVAILABLE: Failed to send \
RPC to coordination service. Either the leader task was preempted/died/restarted unexpectedly \
or this task is experiencing network issues.
"""
# ... and after SIGSTOP of the coordinator (its heartbeats time out).
COORDINATOR_HUNG = """F1202 16:22:08.189191   18571 client.h:80] Terminating process because \
the JAX distributed service detected fatal errors. absl::Status: DEADLINE_EXCEEDED: Deadline \
Exceeded

RPC: /xla.coordination.CoordinationService/Heartbeat
"""
FACTS = {"process": 0, "heartbeat_timeout": 20,
         "hosts": {"0": {"host": "vm-a", "pid": 11}, "1": {"host": "vm-b", "pid": 22}}}


def test_the_abort_names_the_lost_host():
  assert supervisor.lost_processes(WORKER_LOST) == [1]
  assert supervisor.lost_processes(WORKER_LOST.replace("\n1\n", "\n/job:jax_worker/task:3\n")) \
      == [3]
  line = supervisor.lost_host_message(WORKER_LOST, FACTS)
  assert line.startswith("host lost: process 1 (host vm-b, pid 22) stopped sending heartbeats "
                         "for 20 s") and "process 0 stopped too" in line and "\n" not in line
  facts = {**FACTS, "process": 1}
  assert "process 0 (host vm-a, pid 11), the job's coordinator, is gone" in \
      supervisor.lost_host_message(COORDINATOR_GONE, facts)
  assert "process 0 (host vm-a, pid 11), the job's coordinator, did not answer for 20 s" in \
      supervisor.lost_host_message(COORDINATOR_HUNG, facts)
  # Before the hosts were exchanged: the index alone.
  assert "host lost: process 1 stopped" in supervisor.lost_host_message(WORKER_LOST, {})


def test_the_relay_holds_the_runtime_lines_and_drops_them_with_the_abort(capsys):
  relay = supervisor._Relay(debug=False)
  relay.add("model: ViT k=2\n")
  relay.add("E1202 16:17:00.093960   11758 coordination_service_agent.cc:289] Polled an error\n")
  relay.add("1\n")
  for line in WORKER_LOST.splitlines(keepends=True):
    relay.add(line)
  relay.add("*** Check failure stack trace: ***\n")
  relay.add("    @     0x7f3f62e40634  absl::log_internal::LogMessage::SendToLog()\n")
  relay.drop_held()
  assert capsys.readouterr().err == "model: ViT k=2\n"
  assert supervisor.lost_processes(relay.fatal_text()) == [1]
  # Runtime lines that no abort follows are released.
  relay = supervisor._Relay(debug=False)
  relay.add("W1202 16:29:31.265291   26472 preemption_sync_manager.cc:147] Failed\n")
  relay.held_since -= supervisor._HOLD_S + 1
  relay.tick()
  assert "preemption_sync_manager" in capsys.readouterr().err


def test_multihost_is_read_as_absl_reads_it():
  wants = lambda *args: supervisor.wants_multihost(["train.py", *args])
  assert wants("--multihost") and wants("--multihost=true") and wants("-multihost")
  assert not wants() and not wants("--multihost=false") and not wants("--nomultihost")
  assert not wants("--multihost", "--nomultihost") and wants("--nomultihost", "--multihost")
  assert not wants("--config.multihost=1") and not wants("--", "--multihost")
