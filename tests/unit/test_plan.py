"""`tpupipe plan`: bad input fails before anything (exit 2, one message naming the field and what is valid); the
text and JSON outputs list every resource with the run label and the cost; --manifests writes the objects."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from components.platforms.gke.plan import document as plan
from components.spec import SpecError
from components.tpu import pricing
from components.workload import resolve
from pipelines.cli.main import main
from tests.helpers import tpupipe_cmd

# preset, overrides, the field named, text that lists what is valid
BAD_INPUTS = [
    (
        "llama3-8b-v6e-16x2",
        "cluster.topology=4x5",
        "cluster.topology",
        "(valid: 1x1, 2x2, 2x4, 4x4, 4x8, 8x8, 8x16, 16x16)",
    ),
    ("llama3-8b-v6e-16x2", "cluster.num_hosts=3", "cluster.num_hosts", "(valid: 4)"),
    ("gemma4-e2b-tpu7x-16", "cluster.num_hosts=4", "cluster.num_hosts", "(valid: 2)"),
    ("llama3-8b-v6e-16x2", "cluster.num_slices=0", "cluster.num_slices", "(valid: an integer >= 1)"),
    ("llama3-8b-v6e-elastic-spot", "train.min_workers=3", "train.min_workers", "(valid: 4, 8)"),
    ("llama3-8b-v6e-elastic-spot", "train.max_workers=6", "train.max_workers", "(valid: 4, 8)"),
    ("llama3-8b-v6e-elastic-spot", "train.max_workers=12", "train.max_workers", "(valid: 4, 8)"),
    (
        "llama3-8b-v6e-16x2",
        "cluster.capacity=cheap",
        "cluster.capacity",
        "(valid: on-demand, spot, reservation, flex-start, queued)",
    ),
    (
        "llama3-8b-v6e-16x2",
        "cluster.capacity=reservation",
        "cluster.reservation",
        "(valid: a reservation name, projects/PROJECT/reservations/NAME)",
    ),
    ("gemma4-e2b-v6e-16", "cluster.accelerator=v9", "cluster.accelerator", "(valid: cpu, v5e, v5p, v6e, tpu7x)"),
    (
        "gemma4-e2b-v6e-16",
        "cluster.topology=2x2 cluster.num_hosts=1 cluster.num_slices=2 train.num_workers=0",
        "cluster.num_slices",
        "(valid: 1)",
    ),
    ("gemma4-e2b-v6e-16", "train.num_workers=12", "train.num_workers", "(valid: 0, 16)"),
    ("llama3-8b-v6e-16x2", "gke.cluster_mode=autopilot", "gke.multislice_network", "(valid: none)"),
    (
        "llama3-8b-v6e-16x2",
        "gke.cluster_version=1.34.0-gke.1",
        "gke.cluster_version",
        "(valid: >= 1.34.1-gke.1829001, latest)",
    ),
    ("gemma4-e2b-tpu7x-16", "gke.cluster_version=1.33", "gke.cluster_version", "(valid: >= 1.34.0-gke.2201000"),
    (
        "llama3-8b-v6e-16x2",
        "gke.multislice_network=fast",
        "gke.multislice_network",
        "(valid: dcn_networks, accelerator_network_profile, none)",
    ),
    ("llama3-8b-v6e-16x2", "gke.project=Bad_Project", "gke.project", "(valid: 6 to 30 lowercase"),
    ("llama3-70b-v6e-16x2", "gke.pod_range=10.48.0.0/14", "gke.pod_range", "overlaps the DCN subnet 10.50.0.0/16"),
    (
        "llama3-70b-v6e-16x2",
        "gke.service_range=10.60.16.0/20",
        "gke.service_range",
        "overlaps the DCN subnet 10.60.0.0/16",
    ),
    ("llama3-70b-v6e-16x2", "gke.pod_range=10.48.0.0/33", "gke.pod_range", "is not an IPv4 range"),
    ("local-fsdp", "", "cluster.accelerator", "(valid: v5e, v5p, v6e, tpu7x)"),
]


@pytest.mark.parametrize(
    ("preset", "overrides", "field", "valid"), BAD_INPUTS, ids=[f"{p}[{o}]" for p, o, _, _ in BAD_INPUTS]
)
def test_bad_input_exits_2_with_one_message(capsys, preset, overrides, field, valid):
    argv = ["plan", preset] + (["--set", overrides] if overrides else [])
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"tpupipe: error: {field}: ")
    assert valid in lines[0]


def test_the_console_script_exits_2():
    proc = subprocess.run(
        [*tpupipe_cmd(), "plan", "llama3-8b-v6e-16x2", "--set", "cluster.topology=4x5"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().startswith("tpupipe: error: cluster.topology: '4x5' is not a v6e topology")


def test_text_lists_every_resource_with_the_run_label_and_the_cost(capsys):
    assert main(["plan", "llama3-70b-v6e-16x2"]) == 0
    text = capsys.readouterr().out
    document = plan.build(resolve("llama3-70b-v6e-16x2"), "llama3-70b-v6e-16x2")
    for resource in document["resources"]:
        assert resource["name"] in text
    label = "[tpupipe-run=llama3-70b-v6e-16x2"
    created = [r for r in document["resources"] if r["labels"]]
    assert text.count(label) == len(created) >= 12
    assert "ct6e-standard-4t x 4, topology 4x4" in text
    assert "2 replicas x 4 hosts = 8 pods, each google.com/tpu 4" in text
    assert "ScalingConfig(num_workers=8, use_tpu=True, topology='4x4', accelerator_type='TPU-V6E'" in text
    # 32 v6e chips at $2.70 + the head's n2-standard-16 + the cluster fee
    assert "per hour                      $87.28" in text
    assert "for 1 h expected              $87.28" in text


def test_the_70b_plan_creates_a_firewall_rule_with_each_dcn_network_and_teardown_deletes_it_first(capsys):
    """A new VPC denies all ingress: each DCN network comes with a rule that lets the slices' traffic in, listed in the
    plan after its network and subnet, and deleted by teardown before them (newest first)."""
    spec = resolve("llama3-70b-v6e-16x2", "gke.project=my-project")
    document = plan.build(spec, "run70b")
    kinds = [(res["kind"], res["name"]) for res in document["resources"] if res["stage"] == "provision"][:6]
    assert kinds == [
        ("vpc-network", "run70b-dcn0"),
        ("subnetwork", "run70b-dcn0-subnet"),
        ("firewall-rule", "run70b-dcn0-allow-internal"),
        ("vpc-network", "run70b-dcn1"),
        ("subnetwork", "run70b-dcn1-subnet"),
        ("firewall-rule", "run70b-dcn1-allow-internal"),
    ]
    rule = next(res for res in document["resources"] if res["name"] == "run70b-dcn1-allow-internal")
    assert (
        rule["api"] == "compute.firewalls.insert"
        and rule["path"] == "projects/my-project/global/firewalls/run70b-dcn1-allow-internal"
    )
    assert rule["body"] == {
        "name": "run70b-dcn1-allow-internal",
        "network": "projects/my-project/global/networks/run70b-dcn1",
        "direction": "INGRESS",
        "priority": 1000,
        "sourceRanges": ["10.60.0.0/16"],
        "allowed": [{"IPProtocol": "tcp"}, {"IPProtocol": "udp"}, {"IPProtocol": "icmp"}],
        "description": "tpupipe-run=run70b",
    }
    assert rule["labels"] == {"tpupipe-run": "run70b"} and rule["deleted_by_teardown"]
    from google.cloud import compute_v1

    compute_v1.Firewall.from_json(json.dumps(rule["body"]))  # the real client type takes it

    assert (
        main(
            [
                "run",
                "llama3-70b-v6e-16x2",
                "--platform",
                "gke",
                "--dry-run",
                "--run-id",
                "run70b",
                "--set",
                "gke.project=my-project",
            ]
        )
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    create = "  create        compute.firewalls.insert projects/my-project/global/firewalls/run70b-dcn0-allow-internal"
    delete = "  delete        compute.firewalls.delete projects/my-project/global/firewalls/run70b-dcn0-allow-internal"
    network = "  delete        compute.networks.delete projects/my-project/global/networks/run70b-dcn0"
    assert create in lines and lines.index(delete) < lines.index(network)
    assert main(["plan", "llama3-70b-v6e-16x2"]) == 0
    assert "firewall-rule             llama3-70b-v6e-16x2-dcn1-allow-internal" in capsys.readouterr().out


def test_pinned_pod_and_service_ranges_go_into_the_cluster_when_they_clear_the_dcn_subnets():
    spec = resolve("llama3-70b-v6e-16x2", "gke.pod_range=10.8.0.0/14 gke.service_range=10.12.0.0/20")
    (cluster,) = [res for res in plan.build(spec, "ranges")["resources"] if res["kind"] == "gke-cluster"]
    assert cluster["body"]["ipAllocationPolicy"] == {
        "useIpAliases": True,
        "clusterIpv4CidrBlock": "10.8.0.0/14",
        "servicesIpv4CidrBlock": "10.12.0.0/20",
    }
    with pytest.raises(SpecError, match="gke.pod_range: applies to a cluster the run creates"):
        resolve("llama3-70b-v6e-16x2", "gke.pod_range=10.8.0.0/14 gke.cluster_name=shared")


def test_cost_for_the_expected_duration():
    document = plan.build(resolve("llama3-70b-v6e-16x2", "cluster.expected_hours=2.5"), "r")
    cost = document["cost"]
    assert cost["usd_per_hour"] == pytest.approx(32 * 2.70 + 0.776944 + 0.10, abs=1e-4)
    assert cost["usd_for_expected_duration"] == pytest.approx(round(cost["usd_per_hour"] * 2.5, 2))
    assert cost["missing_prices"] == []
    assert set(cost["sources"]) == {"tpu/v6e/on-demand", "machine/n2-standard-16/on-demand", "gke/cluster/any"}
    assert all(src["source"].startswith("https://") and src["date"] for src in cost["sources"].values())


def test_missing_prices_are_reported_never_guessed(tmp_path, capsys):
    spot = plan.build(resolve("llama3-8b-v6e-elastic-spot"), "r")["cost"]
    assert spot["usd_per_hour"] is None and spot["missing_prices"] == ["tpu/v6e/spot"]
    assert spot["upper_bound_usd_per_hour"] == pytest.approx(32 * 2.70 + 0.776944 + 0.10, abs=1e-4)
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"tpu/v6e/spot": {"usd": 1.0, "source": "a quote", "date": "2026-11-01"}}))
    assert main(["plan", "llama3-8b-v6e-elastic-spot", "--output", "json", "--prices", str(prices)]) == 0
    cost = json.loads(capsys.readouterr().out)["cost"]
    assert cost["usd_per_hour"] == pytest.approx(32 * 1.0 + 0.776944 + 0.10, abs=1e-4)
    assert cost["sources"]["tpu/v6e/spot"] == {"source": "a quote", "date": "2026-11-01"}
    tpu7x = plan.build(resolve("gemma4-e2b-tpu7x-16"), "r")
    assert tpu7x["cost"]["missing_prices"] == ["tpu/tpu7x/on-demand"]
    assert any("tpu/tpu7x/on-demand" in w for w in tpu7x["warnings"])


def test_bad_price_file_exits_2(tmp_path, capsys):
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"v6e-spot": 1.0}))
    assert main(["plan", "gemma4-e2b-v6e-16", "--prices", str(prices)]) == 2
    assert "--prices" in capsys.readouterr().err
    with pytest.raises(pricing.PriceError):
        pricing.load(tmp_path / "missing.json")


def test_json_shape(capsys):
    assert main(["plan", "gemma4-e2b-tpu7x-16", "--output", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert list(document) == [
        "plan_version",
        "run_id",
        "preset",
        "platform",
        "label",
        "project",
        "zone",
        "region",
        "cluster",
        "slice",
        "resources",
        "identities",
        "readiness",
        "training",
        "cost",
        "limits",
        "before_training",
        "warnings",
        "spec",
    ]
    assert document["label"] == {"tpupipe-run": "gemma4-e2b-tpu7x-16"}
    assert document["slice"]["logical_devices_per_host"] == 8 and document["slice"]["pod_type"] == "v7x-16"
    for resource in document["resources"]:
        assert set(resource) == {
            "kind",
            "name",
            "action",
            "stage",
            "labels",
            "deleted_by_teardown",
            "summary",
            "api",
            "path",
            "body",
        }
        assert resource["action"] in ("create", "use", "get-or-create")
    kinds = [r["kind"] for r in document["resources"]]
    assert kinds.count("node-pool") == 2 and "workload-policy" in kinds
    assert document["training"]["scaling_config"]["accelerator_type"] == "TPU-V7X"
    assert resolve("gemma4-e2b-tpu7x-16").to_dict() == document["spec"]


def test_manifests_directory(tmp_path, capsys):
    out = tmp_path / "manifests"
    assert main(["plan", "llama3-8b-v6e-16x2", "--manifests", str(out)]) == 0
    assert "manifests: 7 Kubernetes objects" in capsys.readouterr().out
    files = sorted(p.name for p in out.iterdir())
    assert files == [
        "00-namespace-tpupipe.yaml",
        "01-serviceaccount-tpupipe-llama3-8b-v6e-16x2.yaml",
        "02-networkpolicy-llama3-8b-v6e-16x2-isolate.yaml",
        "03-networkpolicy-llama3-8b-v6e-16x2-job-api.yaml",
        "04-networkpolicy-llama3-8b-v6e-16x2-egress.yaml",
        "05-resourceclaimtemplate-llama3-8b-v6e-16x2-dcn-nics.yaml",
        "06-raycluster-llama3-8b-v6e-16x2.yaml",
    ]
    document = plan.build(resolve("llama3-8b-v6e-16x2"), "llama3-8b-v6e-16x2")
    loaded = [yaml.safe_load((out / name).read_text()) for name in files]
    assert loaded == plan.kubernetes_objects(document)


def test_run_id_option_renames_everything(capsys):
    assert main(["plan", "gemma4-e2b-v6e-16", "--output", "json", "--run-id", "nightly-42"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["run_id"] == "nightly-42"
    for r in document["resources"]:
        if r["labels"]:
            assert r["labels"] == {"tpupipe-run": "nightly-42"}
    assert main(["plan", "gemma4-e2b-v6e-16", "--run-id", "Bad_Id"]) == 2


def test_plan_needs_no_cloud_client_and_no_yaml_for_json():
    code = (
        "import sys; from pipelines.cli.main import main; main(['plan', 'llama3-70b-v6e-16x2', '--output', 'json']); "
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('kubernetes', 'ray', 'yaml', 'jsonschema', 'kfp', "
        "'grpc') or m.startswith(('google.cloud.', 'google.api_core', 'google.auth'))]; "
        "sys.stderr.write(repr(heavy))"
    )
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip() == "[]"


def test_spec_errors_come_before_the_plan():
    with pytest.raises(SpecError):
        plan.check_plannable(resolve("local-fsdp"))


def test_every_kind_the_plan_lists_has_a_handler_that_creates_it():
    from components.platforms.gke.plan.records import STAGE_OF_KIND
    from components.platforms.gke.run.walk import HANDLERS

    assert set(HANDLERS) == set(STAGE_OF_KIND)
    kinds = {
        res["kind"]
        for preset in ("gemma4-e2b-tpu7x-16", "llama3-70b-v6e-16x2")
        for res in plan.build(resolve(preset), preset)["resources"]
    }
    assert kinds <= set(HANDLERS)


def test_the_text_plan_shows_the_trainers_command_line(capsys):
    assert main(["plan", "llama3-8b-v6e-16x2"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("entrypoint"))
    assert "python -m trainers.maxtext_train train --spec <the run spec, JSON>" in line
    assert "--scaling-config" in line and "-- dataset_type=synthetic" in line and "ici_fsdp_parallelism=4" in line


def test_plan_smoke_is_the_smallest_single_host_slice_in_a_zone_that_offers_it_and_shows_its_price(capsys):
    from components.tpu import catalogue

    assert main(["plan", "smoke", "--set", "gke.project=my-project"]) == 0
    text = capsys.readouterr().out
    assert main(["plan", "smoke", "--set", "gke.project=my-project", "--output", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    single = [
        catalogue.slice_shape(f, t).num_chips
        for f in catalogue.FAMILIES
        for t in catalogue.topologies(f)
        if not catalogue.slice_shape(f, t).multi_host
    ]
    s = document["slice"]
    assert s["total_chips"] == min(single) == 1 and s["total_hosts"] == 1 and not s["multi_host"]
    assert document["zone"] in catalogue.zones(s["family"])
    assert not any("not among the zones documented" in w for w in document["warnings"])
    cost = document["cost"]
    assert cost["usd_per_hour"] == pytest.approx(2.70 + 0.388472 + 0.10, abs=1e-4)  # the chip, the head, GKE's fee
    assert "per hour                      $3.19" in text
    # The chips billed before the first training step: readiness and the slice check, the image built beside.
    before = document["before_training"]
    assert before["chips"] == 1 and before["image_build"] == "beside provision"
    minutes = (before["readiness_s"] + before["slice_check_s"]) / 60
    assert before["chip_minutes_at_most"] == pytest.approx(minutes, abs=0.1)
    assert "before training               at most" in text
    assert document["training"]["scaling_config"]["num_workers"] == 1


@pytest.mark.parametrize(
    ("dataset", "first"),
    [
        (
            "gs://acme-sft/drops/{date}/",
            "  read          storage.objects.list gs://acme-sft/drops/{date}/ (train.dataset;",
        ),
        (
            "bq://acme-data.sft.examples",
            "  read          bigquery.tables.get bq://acme-data.sft.examples (train.dataset:",
        ),
    ],
)
def test_the_dry_run_starts_with_the_data_snapshot_before_anything_is_created(capsys, dataset, first):
    from pipelines.cli.main import main

    sets = f"gke.project=my-project train.dataset={dataset}" + (
        " train.dataset_time_column=ingested" if dataset.startswith("bq://") else ""
    )
    assert main(["run", "smoke", "--platform", "gke", "--dry-run", "--run-id", "data", "--set", sets]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == "snapshot_data" and lines[2].startswith(first)
    written = "  write         the run's state data/manifest.json, card.md (the data card), train.jsonl, heldout.jsonl"
    assert lines.index(written) < lines.index("provision")
    granted = "  check         storage.buckets.testIamPermissions gs://acme-sft (the caller may list and read it)"
    assert (granted in lines) == dataset.startswith("gs://")
    copies = [i for i, line in enumerate(lines) if line.startswith("  copy          the snapshot's train.jsonl")]
    assert len(copies) == 1 and copies[0] == lines.index("train") + 1
    if dataset.startswith("gs://"):  # with a marker, its read first
        assert (
            main(
                [
                    "run",
                    "smoke",
                    "--platform",
                    "gke",
                    "--dry-run",
                    "--run-id",
                    "data",
                    "--set",
                    sets + " train.dataset_ready=_SUCCESS",
                ]
            )
            == 0
        )
        ready = capsys.readouterr().out.splitlines()
        assert ready[2] == (
            "  read          storage.objects.get gs://acme-sft/drops/{date}/_SUCCESS (train.dataset_ready: the drop is "
            "read only once it is there)"
        )
    if dataset.startswith("bq://"):  # the read session is the run's project's, whichever project holds the table
        assert "one read session of my-project, billed there" in lines[3]
