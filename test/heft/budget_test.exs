defmodule Heft.BudgetTest do
  # Bounded tables (`max_records`, `max_bytes`): they evict to stay within
  # the bound, against a model of what was inserted; keys read stay; the
  # info/1 item; persistent tables log evictions and reopen as they were;
  # bad options are refused. The policy's own tests are in heft_core's
  # table/evict.rs and table.rs.
  use ExUnit.Case, async: true

  @types [:set, :ordered_set, :bag, :duplicate_bag]

  defp record(i), do: {i, %{id: i, blob: :binary.copy(<<rem(i, 251)>>, rem(i * 37, 300))}}

  defp tmp_dir(tag) do
    dir = Path.join(System.tmp_dir!(), "heft-budget-#{tag}-#{System.unique_integer([:positive])}")
    File.rm_rf!(dir)
    on_exit(fn -> File.rm_rf!(dir) end)
    dir
  end

  test "a table bounded in records holds at most that many, and every record it holds was inserted last" do
    for type <- @types do
      t = Heft.new(:bounded, [type, max_records: 1_000])

      for i <- 1..10_000 do
        Heft.insert(t, record(i))
        assert Heft.info(t, :size) <= 1_000
      end

      assert Heft.info(t, :size) == 1_000
      for {i, _} = r <- Heft.tab2list(t), do: assert(r == record(i))
      b = Heft.info(t, :budget)
      assert %{max_records: 1_000, max_bytes: nil, evicted_records: 9_000} = b
      assert b.evicted_keys == 9_000
      Heft.delete(t)
    end
  end

  test "a table bounded in bytes stays within them, and :memory comes back within them once compacted" do
    for type <- @types do
      budget = 2 * 1024 * 1024
      t = Heft.new(:bounded, [type, :public, max_bytes: budget])

      for chunk <- Enum.chunk_every(1..60_000, 500) do
        Heft.insert(t, Enum.map(chunk, &record/1))
        assert Heft.info(t, :budget).used_bytes <= budget
      end

      b = Heft.info(t, :budget)
      assert b.evicted_records > 0 and Heft.info(t, :size) > 1_000, inspect({type, b})
      {:ok, _} = Heft.compact(t)
      memory = Heft.info(t, :memory)
      assert memory <= budget * 1.05, inspect({type, memory, Heft.info(t)})
      Heft.delete(t)
    end
  end

  test "keys that are read stay; scans do not keep keys" do
    for type <- @types do
      t = Heft.new(:bounded, [type, max_records: 2_000])
      hot = Enum.map(1..200, &(&1 * 13))

      for i <- 1..30_000 do
        Heft.insert(t, record(i))

        if rem(i, 50) == 0 do
          for h <- hot, h <= i, do: Heft.lookup(t, h)
          # A full scan marks nothing.
          Heft.select_count(t, [{:_, [], [true]}])
        end
      end

      assert Enum.all?(hot, &Heft.member(t, &1)), inspect(type)
      b = Heft.info(t, :budget)
      assert b.hits > 0 and b.misses == 0
      # Keys neither read nor recent are gone: all but the few whose
      # eviction mark a hot key's shares (the marks are hashed).
      cold = Enum.reject(1..1_000, &(&1 in hot))
      gone = Enum.reject(cold, &Heft.member(t, &1))
      assert length(gone) >= length(cold) * 0.95, inspect({type, length(gone)})
      misses = Heft.info(t, :budget).misses
      assert misses == length(gone)
      assert Heft.lookup(t, hd(gone)) == []
      assert Heft.info(t, :budget).misses == misses + 1
      Heft.delete(t)
    end
  end

  test "an unbounded table has no :budget and counts nothing" do
    t = Heft.new(:unbounded)
    Heft.insert(t, {1, 2})
    Heft.lookup(t, 1)
    assert Heft.info(t, :budget) == nil
    assert Heft.info(t)[:budget] == nil
  end

  test "a large write on a full table evicts all it needs" do
    t = Heft.new(:bounded, max_bytes: 1024 * 1024, compression: :none)
    for i <- 1..5_000, do: Heft.insert(t, {i, :binary.copy(<<i>>, 100)})
    before = Heft.info(t, :budget).evicted_keys
    # 512 KiB in one write: more than a normal scheduler's share of
    # evictions, done on a dirty one.
    Heft.insert(t, {:big, :crypto.strong_rand_bytes(512 * 1024)})
    b = Heft.info(t, :budget)
    assert b.used_bytes <= 1024 * 1024
    assert b.evicted_keys - before > 64
    assert [{:big, _}] = Heft.lookup(t, :big)
  end

  test "bad budgets are refused" do
    for opt <- [max_bytes: 0, max_bytes: -1, max_records: 1.5, max_records: :many] do
      assert_raise ArgumentError, ~r/invalid value/, fn -> Heft.new(:bad, [opt]) end
    end
  end

  test "a persistent bounded table logs its evictions: reopened, it holds what it held" do
    for type <- @types do
      dir = tmp_dir(type)
      t = Heft.new(:pbounded, [type, persist: dir, max_records: 500])
      for i <- 1..3_000, do: Heft.insert(t, record(i))
      held = Enum.sort(Heft.tab2list(t))
      assert length(held) == 500
      :ok = Heft.close(t)

      {:ok, t} = Heft.open(dir)
      assert Enum.sort(Heft.tab2list(t)) == held
      assert Heft.info(t, :budget) == nil, "the bound is not stored"
      :ok = Heft.close(t)

      # Reopened under a lower bound: evicted down to it at once, and
      # that is logged too.
      {:ok, t} = Heft.open(dir, max_records: 100)
      assert Heft.info(t, :size) == 100
      now = Enum.sort(Heft.tab2list(t))
      :ok = Heft.close(t)
      {:ok, t} = Heft.open(dir)
      assert Enum.sort(Heft.tab2list(t)) == now
      Heft.delete(t)
    end
  end
end
