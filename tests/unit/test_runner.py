from components.stages.ray_stages import restarts


def test_restarts_count_starts_of_the_worker_group_once_each_even_when_a_line_came_twice():
    first, again = {"event": "worker_group_started", "time": 100.0}, {"event": "worker_group_started", "time": 160.5}
    data = {"event": "data", "data_snapshot": "sha256:00"}
    assert restarts([]) == 0
    assert restarts([first, data]) == 0
    assert restarts([first, dict(first), data]) == 0  # Ray forwarded the line twice: still one start
    assert restarts([first, dict(first), again, dict(again)]) == 1
