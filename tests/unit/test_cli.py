"""``tpupipe presets``: one row per preset, each column starting at the same place on every row."""

from components.spec import presets
from pipelines.cli.main import main


def test_presets_lines_up_every_column(capsys):
    assert main(["presets"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list(presets.PRESETS)
    shape_starts, model_starts = set(), set()
    for line, (name, layers) in zip(lines, presets.PRESETS.items(), strict=True):
        cluster = layers.get("cluster", {})
        shape = " ".join(filter(None, (cluster.get("accelerator", "cpu"), cluster.get("topology"))))
        shape_starts.add(line.index(shape, len(name)))
        model = layers.get("train", {}).get("model_id", "")
        if model:
            model_starts.add(line.index(model, line.index(shape, len(name)) + len(shape)))
    longest = max(presets.PRESETS, key=len)
    assert len(shape_starts) == 1 and shape_starts.pop() > len(longest), "the shapes start in one column"
    assert len(model_starts) == 1, "the model ids start in one column"
