from kernel.children import RestartBudget


def test_allows_max_restarts_within_the_period_then_refuses():
    budget = RestartBudget(max_restarts=3, period_s=10)
    assert [budget.allow(now=t) for t in (0, 1, 2, 3)] == [True, True, True, False]


def test_old_restarts_leave_the_window():
    budget = RestartBudget(max_restarts=2, period_s=10)
    assert budget.allow(now=0) and budget.allow(now=5)
    assert not budget.allow(now=9)
    assert budget.allow(now=15.5)
