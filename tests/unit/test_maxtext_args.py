"""MaxText's argument lists (seed workload A) and the MaxText spec checks."""

import json
import math

import pytest

from components.spec import SpecError
from components.workload import derive, resolve
from components.workload import maxtext as maxtext_args
from trainers import maxtext_log


def args(preset, overrides="", output_dir="/data/", run_name="RUN"):
    return maxtext_args.train_args(resolve(preset, overrides), output_dir, run_name)


def test_llama3_8b_is_the_seed_command():
    # Seed A: dataset_type=synthetic per_device_batch_size=4 max_target_length=4096 model_name=llama3-8b
    # steps=100 ici_fsdp_parallelism=4 ici_tensor_parallelism=4 base_output_directory=/data/ run_name=...
    assert args("llama3-8b-v6e-16x2") == [
        "dataset_type=synthetic",
        "per_device_batch_size=4",
        "max_target_length=4096",
        "model_name=llama3-8b",
        "steps=100",
        "ici_fsdp_parallelism=4",
        "ici_tensor_parallelism=4",
        "checkpoint_period=20",  # beyond the seed: maxtext.max_lost_steps (MaxText's 10000 saves only step 0)
        "max_num_checkpoints_to_keep=2",  # beyond the seed: MaxText keeps every checkpoint otherwise
        "enable_autocheckpoint=true",  # beyond the seed: a save on a preemption notice
        "base_output_directory=/data/",
        "run_name=RUN",
        "log_config=false",  # beyond the seed: no log line per config parameter per host
    ]


def test_llama3_70b_is_the_seed_command():
    # Seed A: per_device_batch_size=2 model_name=llama3-70b ici_tensor_parallelism=4 ici_fsdp_parallelism=4
    # dcn_fsdp_parallelism=2 dcn_data_parallelism=1 remat_policy=full (2D inside a slice, FSDP across slices)
    assert args("llama3-70b-v6e-16x2") == [
        "dataset_type=synthetic",
        "per_device_batch_size=2",
        "max_target_length=4096",
        "model_name=llama3-70b",
        "steps=100",
        "ici_fsdp_parallelism=4",
        "ici_tensor_parallelism=4",
        "dcn_data_parallelism=1",
        "dcn_fsdp_parallelism=2",
        "remat_policy=full",
        "checkpoint_period=20",
        "max_num_checkpoints_to_keep=2",
        "enable_autocheckpoint=true",
        "base_output_directory=/data/",
        "run_name=RUN",
        "log_config=false",
    ]


def test_elastic_spot_runs_the_8b_command():
    assert args("llama3-8b-v6e-elastic-spot") == args("llama3-8b-v6e-16x2")
    spec = resolve("llama3-8b-v6e-elastic-spot")
    assert (spec.train.min_workers, spec.train.max_workers, spec.train.max_failures) == (4, 8, 3)
    assert spec.cluster.capacity == "spot"


def test_local_maxtext_is_a_tiny_llama_on_two_emulated_hosts():
    argv = args("local-maxtext", output_dir="/runs/r/train")
    assert "model_name=default" in argv and "decoder_block=llama2" in argv
    assert "ici_fsdp_parallelism=2" in argv and "ici_tensor_parallelism=2" in argv
    assert "hardware=cpu" in argv and "skip_jax_distributed_system=true" in argv
    assert "checkpoint_period=10" in argv and "steps=40" in argv
    spec = resolve("local-maxtext")
    assert maxtext_args.devices_per_host(spec) * spec.total_hosts == 4


ELASTIC = "cluster.num_slices=2 cluster.num_hosts=1 train.min_workers=1 train.max_workers=2"


def test_an_elastic_local_run_needs_a_mesh_that_fits_every_group():
    spec = resolve("local-maxtext", f"{ELASTIC} maxtext.ici_fsdp_parallelism=-1")
    assert maxtext_args.worker_counts(spec) == [1, 2]
    assert derive.scaling_config_args(spec)["num_workers"] == (1, 2)
    argv = maxtext_args.train_args(spec, "/o", "r")
    assert "ici_tensor_parallelism=2" in argv and not any(a.startswith("ici_fsdp") for a in argv)  # -1: MaxText's
    assert maxtext_args.worker_counts(resolve("llama3-8b-v6e-elastic-spot")) == [4, 8]  # 1 or 2 whole slices


def test_tpu_hosts_have_their_logical_devices():
    assert maxtext_args.devices_per_host(resolve("llama3-8b-v6e-16x2")) == 4


def test_eval_args_freeze_training_and_load_the_checkpoint():
    train = args("local-maxtext", output_dir="/out", run_name="r")
    argv = maxtext_log.eval_args(train, "r-eval", 4, "/ck/39/items")
    assert "steps=1" in argv and "learning_rate=0" in argv and "enable_checkpointing=false" in argv
    assert "eval_interval=1" in argv and "eval_steps=4" in argv and "load_parameters_path=/ck/39/items" in argv
    assert not any(a.startswith("checkpoint_period=") or a == "steps=40" for a in argv)
    assert [a for a in argv if a.startswith("run_name=")] == ["run_name=r-eval"]
    assert "base_output_directory=/out" in argv and "model_name=default" in argv  # the trained model's arguments
    assert "load_parameters_path" not in " ".join(maxtext_log.eval_args(train, "r", 4, ""))


@pytest.mark.parametrize(
    "preset, overrides, field",
    [
        ("local-maxtext", "maxtext.ici_fsdp_parallelism=3", "maxtext.ici_fsdp_parallelism"),
        ("local-maxtext", "maxtext.ici_tensor_parallelism=4", "maxtext.ici_fsdp_parallelism"),
        ("local-maxtext", "maxtext.model_name=llama9-1t", "maxtext.model_name"),
        ("local-maxtext", "maxtext.steps=0", "maxtext.steps"),
        ("local-maxtext", "maxtext.per_device_batch_size=0", "maxtext.per_device_batch_size"),
        (
            "local-maxtext",
            "maxtext.ici_fsdp_parallelism=-1 maxtext.ici_tensor_parallelism=-1",
            "maxtext.ici_tensor_parallelism",
        ),
        ("local-maxtext", "maxtext.dataset_type=tfds", "maxtext.dataset_type"),
        (  # a hub dataset is snapshotted like any other: MaxText reads it through its Hugging Face pipeline
            "local-maxtext",
            "train.dataset=databricks/databricks-dolly-15k maxtext.dataset_type=synthetic",
            "maxtext.dataset_type",
        ),
        ("local-maxtext", f"{ELASTIC}", "maxtext.ici_fsdp_parallelism"),  # fsdp 2 x tensor 2 fits no 1-host group
        (
            "local-maxtext",
            f"{ELASTIC} maxtext.ici_fsdp_parallelism=-1 maxtext.ici_tensor_parallelism=4",
            "maxtext.ici_tensor_parallelism",
        ),
        ("local-maxtext", "train.min_workers=1 train.max_workers=2", "train.min_workers"),  # not whole slices
        ("llama3-8b-v6e-elastic-spot", "maxtext.dcn_data_parallelism=2", "maxtext.dcn_data_parallelism"),
        ("llama3-70b-v6e-16x2", "maxtext.dcn_fsdp_parallelism=4", "maxtext.dcn_fsdp_parallelism"),
        ("llama3-8b-v6e-16x2", "maxtext.ici_fsdp_parallelism=8", "maxtext.ici_fsdp_parallelism"),
    ],
)
def test_bad_maxtext_specs_name_the_field(preset, overrides, field):
    with pytest.raises(SpecError) as err:
        resolve(preset, overrides)
    assert err.value.field == field, str(err.value)


def test_the_mesh_axes_come_from_maxtexts_base_yml_as_its_config_is_not_logged():
    base = "steps: 150000\nmesh_axes: ['data', 'stage', 'fsdp', 'tensor'] # the axes\nlogical_axis_rules: [['x', []]]\n"
    assert maxtext_log.mesh_axes(base) == ["data", "stage", "fsdp", "tensor"]
    assert maxtext_log.mesh_axes("steps: 1\n") == []
    assert "log_config=false" in args("local-maxtext")


def test_parse_step_reads_maxtexts_step_line():
    line = (
        "completed step: 99, seconds: 0.693, TFLOP/s/device: 83.171, Tokens/s/device: 11819.175, "
        "total_weights: 262144, loss: 0.334"
    )
    assert maxtext_log.parse_step("(RayTrainWorker pid=1) " + line) == {
        "step": 99,
        "loss": 0.334,
        "step_s": 0.693,
        "tflops_per_s_per_device": 83.171,
        "tokens_per_s_per_device": 11819.175,
    }
    assert maxtext_log.parse_step("completed eval step: 3") is None


def test_the_driver_reads_the_job_command_it_is_given():
    import shlex

    from components.workload.derive import job_command
    from trainers import maxtext_train

    spec = resolve("local-maxtext")
    argv = shlex.split(job_command(spec, "train", "/out", "run"))
    assert argv[:4] == ["python", "-m", "trainers.maxtext_train", "train"]
    args, maxtext = maxtext_train.parse_args(argv[3:])
    assert args.mode == "train" and args.run_name == "run" and args.output_dir == "/out"
    assert maxtext == maxtext_args.train_args(spec, "/out", "run")
    with pytest.raises(SystemExit):
        maxtext_train.parse_args([*argv[3:], "not-a-key-value"])


def test_the_checkpoint_period_derives_from_the_steps_a_preemption_may_repeat_and_the_plan_shows_it():
    from components.platforms.gke.plan import document as plan

    spec = resolve("llama3-8b-v6e-elastic-spot")  # MaxText's own default (10000) would save only step 0 of 100
    assert (spec.maxtext.max_lost_steps, maxtext_args.checkpoint_period(spec)) == (20, 20)
    assert "checkpoint_period=20" in args("llama3-8b-v6e-elastic-spot")
    assert maxtext_args.checkpoint_period(resolve("local-maxtext", "max_lost_steps=5")) == 5
    assert maxtext_args.checkpoint_period(resolve("local-maxtext", "max_lost_steps=5 checkpoint_period=2")) == 2
    assert maxtext_args.checkpoint_period(resolve("local-maxtext", "max_lost_steps=500")) == 40  # at most steps
    with pytest.raises(SpecError) as info:
        resolve("local-maxtext", "checkpoint_period=25")  # max_lost_steps=10 in the preset
    assert info.value.field == "maxtext.checkpoint_period" and "more than maxtext.max_lost_steps=10" in str(info.value)
    with pytest.raises(SpecError, match="maxtext.max_lost_steps: must be at least 1"):
        resolve("local-maxtext", "max_lost_steps=0")
    document = plan.build(spec, "r")
    checkpoints = document["training"]["checkpoints"]
    assert (checkpoints["period_steps"], checkpoints["max_lost_steps"], checkpoints["kept"]) == (20, 20, 2)
    text = plan.render_text(document)
    assert "checkpoints every 20 steps: a preemption repeats at most as many (maxtext.max_lost_steps=20)" in text
    assert "checkpoints" not in plan.build(resolve("gemma4-e2b-v6e-16"), "r")["training"]


def test_a_nan_loss_is_read_not_dropped():
    # MaxText formats its losses with f"{loss:.3f}" (maxtext/common/metric_logger.py): a diverged run prints nan
    line = "Completed eval after train step 0, loss=nan, perplexity=nan, total_weights=512.0, avg_z_loss=0.000"
    assert math.isnan(float(maxtext_log.EVAL_LINE.search(line)["loss"]))
    step = maxtext_log.parse_step(
        "completed step: 3, seconds: 0.1, TFLOP/s/device: 1.0, Tokens/s/device: 2.0, total_weights: 8, loss: nan"
    )
    assert step is not None and math.isnan(step["loss"])


def test_the_metrics_file_gives_the_losses_at_full_precision_as_it_grows(tmp_path):
    path = tmp_path / "metrics.jsonl"
    metrics = maxtext_log.MetricsFile(str(path))
    assert metrics.read() == []  # not written yet
    row = {"learning/loss": 5.123456789, "step": 0.0, "run_name": "r"}
    path.write_text(json.dumps(row) + "\n" + '{"learning/loss": 4.9')  # the second line half written
    assert metrics.read() == [row]
    with path.open("a") as f:
        f.write('87654321, "step": 1.0, "run_name": "r"}\n{"eval/avg_loss": NaN, "step": 1.0}\n')
    later = metrics.read()
    assert later[0]["learning/loss"] == 4.987654321 and math.isnan(later[1][maxtext_log.EVAL_LOSS])
    path.write_text(json.dumps(row) + "\n")  # MaxText empties the file when it writes step 0 again
    assert metrics.read() == [row]
    # the eval after train step 0 empties it again, with a longer line than the one read before
    longer = {"eval/avg_loss": 2.123456789, "eval/total_weights": 512.0, "step": 0.0, "run_name": "r" * 300}
    path.write_text(json.dumps(longer) + "\n")
    assert metrics.read() == [longer]
