defmodule Heft.Contract.ConcurrencyTest do
  @moduledoc """
  A public table used by several processes at once: single operations are
  atomic (no lost updates), and a table deleted under its users turns their
  calls into ArgumentError, nothing worse.
  """
  use Heft.Contract.Case, async: true

  @workers 4

  # Runs `fun.(worker_index)` in @workers processes at once; returns results.
  defp in_parallel(fun) do
    1..@workers
    |> Enum.map(fn i -> Task.async(fn -> fun.(i) end) end)
    |> Enum.map(&Task.await(&1, 60_000))
  end

  contract "update_counter from several processes loses no increment" do
    tab = new_with(m, {:counter, 0, 0}, [:public])

    in_parallel(fn _ ->
      for _ <- 1..2_000, do: m.update_counter(tab, :counter, [{2, 1}, {3, -1}])
    end)

    assert m.lookup(tab, :counter) == [{:counter, 2_000 * @workers, -2_000 * @workers}]
  end

  contract "update_counter/4 with a default: the first caller inserts, nobody overwrites" do
    tab = new(m, [:public])

    in_parallel(fn _ ->
      for k <- 1..500, do: m.update_counter(tab, k, 1, {k, 0})
    end)

    assert contents(m, tab) == for(k <- 1..500, do: {k, @workers})
  end

  contract "insert_new from several processes: exactly one wins each key" do
    tab = new(m, [:public])
    wins = in_parallel(fn i -> Enum.count(1..1_000, &m.insert_new(tab, {&1, i})) end)
    assert Enum.sum(wins) == 1_000
    assert m.info(tab, :size) == 1_000
  end

  contract "take from several processes: each record is taken exactly once" do
    tab = new_with(m, for(k <- 1..2_000, do: {k}), [:public])
    taken = in_parallel(fn _ -> Enum.flat_map(1..2_000, &m.take(tab, &1)) end)
    assert Enum.sort(List.flatten(taken)) == for(k <- 1..2_000, do: {k})
    assert m.tab2list(tab) == []
  end

  contract "disjoint writers and concurrent readers end with every write in place" do
    tab = new(m, [:public])

    in_parallel(fn i ->
      for k <- 1..1_000 do
        m.insert(tab, {{i, k}, k})
        [{_, ^k}] = m.lookup(tab, {i, k})
        if rem(k, 4) == 0, do: m.delete(tab, {i, k})
      end
    end)

    assert m.info(tab, :size) == @workers * 750
    assert m.lookup(tab, {1, 3}) == [{{1, 3}, 3}]
    assert m.lookup(tab, {1, 4}) == []
  end

  contract "users of a table deleted under them get ArgumentError, then keep getting it" do
    tab = new_with(m, for(k <- 1..100, do: {k, 0}), [:public])
    parent = self()

    users =
      for i <- 1..@workers do
        spawn_link(fn ->
          # Use the table until it is gone; report what the first failure was.
          send(parent, {:ready, i})
          result = use_until_gone(m, tab, 0)
          send(parent, {:done, i, result})
        end)
      end

    for i <- 1..@workers, do: assert_receive({:ready, ^i}, 5_000)
    assert m.delete(tab) == true

    for i <- 1..@workers do
      assert_receive {:done, ^i, {:gone, ArgumentError, ArgumentError}}, 30_000
    end

    assert length(users) == @workers
  end

  defp use_until_gone(m, tab, n) do
    k = rem(n, 100) + 1

    case outcome(fn -> {m.update_counter(tab, k, 1), m.lookup(tab, k), m.insert(tab, {k, n})} end) do
      {:ok, _} -> use_until_gone(m, tab, n + 1)
      {:raise, first} -> {:gone, first, elem(outcome(fn -> m.lookup(tab, 1) end), 1)}
    end
  end
end
