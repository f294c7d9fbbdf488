import json

import pytest

from components.spec import CAPACITY_TYPES, READY_LIMITS_S, SpecError, parse_overrides, presets, ready_limits
from components.spec.names import run_id_from
from components.workload import resolve


@pytest.mark.parametrize("name", sorted(presets.PRESETS))
def test_every_preset_validates_and_round_trips(name):
    spec = resolve(name)
    assert spec.name == name
    assert type(spec).from_json(spec.to_json()) == spec


def test_local_fsdp_is_two_emulated_cpu_hosts():
    spec = resolve("local-fsdp")
    assert spec.cluster.accelerator == "cpu"
    assert spec.total_hosts == 2 and spec.num_workers == 2
    assert spec.train.model_id.startswith("scratch:")


def test_gemma4_presets_match_the_seed_workload():
    v6e, tpu7x = resolve("gemma4-e2b-v6e-16"), resolve("gemma4-e2b-tpu7x-16")
    assert (v6e.cluster.accelerator, v6e.cluster.topology, v6e.cluster.num_hosts) == ("v6e", "4x4", 4)
    assert (tpu7x.cluster.accelerator, tpu7x.cluster.topology, tpu7x.cluster.num_hosts) == ("tpu7x", "2x2x2", 2)
    for spec in (v6e, tpu7x):
        t = spec.train
        assert (t.model_id, t.dataset) == ("google/gemma-4-E2B-it", "databricks/databricks-dolly-15k")
        assert (t.learning_rate, t.weight_decay, t.batch_size, t.epochs, t.max_length) == (2e-5, 0.01, 4, 3, 512)
        assert spec.num_workers == 16


def test_overrides_layer_on_the_preset_with_types():
    spec = resolve("local-fsdp", "epochs=5 cluster.num_hosts=3 train.learning_rate=1e-4")
    assert spec.train.epochs == 5 and spec.cluster.num_hosts == 3 and spec.train.learning_rate == 1e-4
    assert spec.train.batch_size == resolve("local-fsdp").train.batch_size


def test_parse_overrides_accepts_leaf_names_and_lists():
    assert parse_overrides(["epochs=2", "train.seed=3"]) == {"train.epochs": "2", "train.seed": "3"}
    assert parse_overrides("") == {}


@pytest.mark.parametrize(
    "preset, overrides, field",
    [
        ("nope", "", "preset"),
        ("local-fsdp", "nonsense=1", "nonsense"),
        ("local-fsdp", "train.nonsense=1", "train.nonsense"),
        ("local-fsdp", "epochs=0", "train.epochs"),
        ("local-fsdp", "batch_size=0", "train.batch_size"),
        ("local-fsdp", "num_hosts=0", "cluster.num_hosts"),
        ("local-fsdp", "epochs=two", "train.epochs"),
        ("local-fsdp", "dataset=/does/not/exist.jsonl", "train.dataset"),
        ("local-fsdp", "capacity=cheap", "cluster.capacity"),
        ("local-fsdp", "capacity=reservation", "cluster.reservation"),
        ("local-fsdp", "model_id=scratch:huge", "train.model_id"),
        ("local-fsdp", "epochs", "epochs"),
        ("local-fsdp", "gke.node_service_account=nodes", "gke.node_service_account"),
        ("local-fsdp", "gke.node_service_account=nodes@example.com", "gke.node_service_account"),
        ("local-fsdp", "cluster.ready_timeout_s=-1", "cluster.ready_timeout_s"),
        ("local-fsdp", "cluster.ready_timeout_s=nan", "cluster.ready_timeout_s"),
        ("local-fsdp", "testing.host_replace_delay_s=-5", "testing.host_replace_delay_s"),
        ("local-fsdp", "checkpoint_every_steps=-1", "train.checkpoint_every_steps"),
        ("smoke", "testing.host_replace_delay_s=60", "testing.host_replace_delay_s"),  # emulated hosts only
        ("local-fsdp", "testing.drain_host_at_step=-1", "testing.drain_host_at_step"),
        ("smoke", "testing.drain_host_at_step=5", "testing.drain_host_at_step"),  # emulated hosts only
        ("local-fsdp", "testing.host_start_delay_s=-1", "testing.host_start_delay_s"),
        ("smoke", "testing.host_start_delay_s=5", "testing.host_start_delay_s"),  # emulated hosts only
        ("local-fsdp", "testing.host_replace_delay_s=nan", "testing.host_replace_delay_s"),
        ("local-fsdp", "testing.slice_check_corrupt_rank=-2", "testing.slice_check_corrupt_rank"),
        ("local-fsdp", "testing.slice_check_slow_rank=-2", "testing.slice_check_slow_rank"),
        ("local-fsdp", "testing.fail_at_step=-1", "testing.fail_at_step"),
        ("local-fsdp", "fail_at_step=-1", "testing.fail_at_step"),  # by its name alone
        ("local-fsdp", "testing.fail_eval=maybe", "testing.fail_eval"),
        ("local-fsdp", "train.fail_at_step=1", "train.fail_at_step"),  # its former key
        ("local-fsdp", "cluster.preemption_notice_s=0", "cluster.preemption_notice_s"),
        ("local-fsdp", "cluster.preemption_notice_s=121", "cluster.preemption_notice_s"),
        ("gemma4-e2b-v6e-16", "cluster.preemption_notice_s=30", "cluster.preemption_notice_s"),
    ],
)
def test_bad_input_names_the_field(preset, overrides, field):
    with pytest.raises(SpecError) as err:
        resolve(preset, overrides)
    assert err.value.field == field
    assert str(err.value).startswith(f"{field}: ")


def test_unknown_key_lists_the_valid_keys():
    with pytest.raises(SpecError) as err:
        resolve("local-fsdp", "epoch=3")
    assert "train.epochs" in err.value.valid


def test_spec_json_rejects_unknown_keys():
    data = json.loads(resolve("local-fsdp").to_json())
    data["train"]["bogus"] = 1
    with pytest.raises(SpecError, match="train.bogus"):
        type(resolve("local-fsdp")).from_json(json.dumps(data))


def test_existing_dataset_file_is_accepted(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"instruction": "a", "response": "b"}\n')
    assert resolve("local-fsdp", f"dataset={path}").train.dataset == str(path)


def test_run_id_is_a_dns_label():
    assert run_id_from("", "tpupipe-2026-11-29-10-04-42-704747").startswith("tpupipe-2026-11-29")
    assert len(run_id_from("", "X" * 100)) <= 40
    assert run_id_from("", "123abc")[0].isalpha()
    assert run_id_from("my-run", "ignored") == "my-run"
    with pytest.raises(SpecError, match="run_id"):
        run_id_from("Bad_Run", "")


def test_a_run_id_derives_from_what_kfp_resolves_and_refuses_what_it_does_not():
    # A recurring run's Argo Workflow name (NextResourceName: <ScheduledWorkflow>-<index>-<FNV-32a>): the same name,
    # the same id, for every task of the run.
    workflow = "nightlyx7k2p-1-3849203948"
    assert run_id_from("", workflow) == workflow == run_id_from("", workflow)
    long = "a-very-long-recurring-runx7k2p-12-3849203948"
    assert run_id_from("", long) == run_id_from("", long) and len(run_id_from("", long)) <= 40
    assert run_id_from("", "2am-daily5x2k1-3-11")[0] == "r"
    for unresolved, field in (("r-[[RunUUID]]", "run_id"), ("[[ScheduledTime]]", "run_id")):
        with pytest.raises(SpecError, match=rf"^{field}: .*kubeflow/pipelines#12494"):
            run_id_from(unresolved, "")
    with pytest.raises(SpecError, match="^job_name: .*did not fill this placeholder"):
        run_id_from("", "{{$.pipeline_job_resource_name}}")


def test_tpu_hosts_need_a_cpu_per_ray_train_worker():
    with pytest.raises(SpecError) as err:
        resolve("gemma4-e2b-v6e-16", "cluster.cpus_per_host=2")
    assert err.value.field == "cluster.cpus_per_host"


TPU = "cluster.accelerator=v6e cluster.topology=2x2 cluster.num_hosts=1 cluster.cpus_per_host=4"


def test_readiness_deadlines_come_by_capacity_type_and_autopilot_unless_the_spec_sets_one():
    assert set(READY_LIMITS_S) == {*CAPACITY_TYPES, "autopilot"}
    on_demand = ready_limits(resolve("local-fsdp", TPU))
    # A fixed pool's deadline derives from its hosts and its image (tests/gke/test_readiness_limits.py).
    assert READY_LIMITS_S["on-demand"][0] is None and on_demand.unschedulable_grace_s == READY_LIMITS_S["on-demand"][1]
    assert on_demand.by == (
        "cluster.capacity=on-demand: 180 s + a 8 GiB image at an assumed 50 MiB/s (164 s) + 10 s x 1 hosts"
    )
    assert on_demand.deadline_s == 354 and on_demand.failed_scale_up_grace_s == 0  # a FailedScaleUp is final
    flex = ready_limits(resolve("local-fsdp", TPU + " cluster.capacity=flex-start"))
    assert flex.deadline_s == READY_LIMITS_S["flex-start"][0] >= 10 * on_demand.deadline_s  # far longer
    assert flex.failed_scale_up_grace_s == 1800  # the autoscaler retries a stockout
    autopilot = ready_limits(resolve("local-fsdp", TPU + " gke.cluster_mode=autopilot"))
    assert autopilot.deadline_s == READY_LIMITS_S["autopilot"][0] > on_demand.deadline_s
    assert autopilot.by == "cluster.capacity=on-demand, gke.cluster_mode=autopilot"
    both = ready_limits(resolve("local-fsdp", TPU + " gke.cluster_mode=autopilot cluster.capacity=flex-start"))
    assert both.deadline_s == max(READY_LIMITS_S["flex-start"][0], READY_LIMITS_S["autopilot"][0])
    set_by_hand = ready_limits(resolve("local-fsdp", TPU + " cluster.capacity=flex-start cluster.ready_timeout_s=90"))
    assert (set_by_hand.deadline_s, set_by_hand.by) == (90, "cluster.ready_timeout_s")
    assert set_by_hand.unschedulable_grace_s == READY_LIMITS_S["flex-start"][1]
