defmodule Heft.TierTest do
  # Tiered arenas (`arena: {:file, dir, memory: bytes}`): records in memory
  # up to the budget, the ones read least moved out to the file, every
  # call answering as ETS does whichever tier a record is in (the engine's
  # own tests are in heft_core's table/tier.rs).
  use ExUnit.Case, async: true

  alias Heft.Test.Wait

  @moduletag :tmp_dir
  @moduletag timeout: 180_000

  @budget 256 * 1024

  defp record(i, salt), do: {i, salt, :crypto.strong_rand_bytes(200 + rem(i * 7919, 1000))}

  defp memory_live(t), do: Heft.info(t, :tier).memory_live_bytes

  # Records read often staying in memory, and which records move out,
  # are heft_core's tests (table/tier.rs): no call tells which tier a
  # record is in.

  # Waits until the mover has brought memory under the budget.
  defp moved(t) do
    assert Wait.until(fn -> memory_live(t) <= @budget end, 20_000), inspect(Heft.info(t, :tier))
    Heft.info(t, :tier)
  end

  defp both(type, dir) do
    {Heft.new(:tiered, [type, :public, arena: {:file, dir, memory: @budget}]),
     :ets.new(:reference, [type, :public])}
  end

  test "every table type answers as ETS once most records are in the file", %{tmp_dir: dir} do
    for type <- [:set, :ordered_set, :bag, :duplicate_bag] do
      {t, e} = both(type, dir)
      objs = for i <- 1..3_000, do: record(i, 0)
      Enum.each(objs, &Heft.insert(t, &1))
      :ets.insert(e, objs)
      tier = moved(t)
      assert tier.moved_records > 0 and tier.file_live_bytes > 4 * @budget, inspect(tier)
      # Overwrites, deletes and new objects, in both tiers.
      for i <- 1..3_000//3 do
        o = record(i, 1)
        Heft.insert(t, o)
        :ets.insert(e, o)
      end

      for i <- 2..3_000//3 do
        Heft.delete(t, i)
        :ets.delete(e, i)
      end

      for o <- Enum.take_random(:ets.tab2list(e), 300) do
        Heft.delete_object(t, o)
        :ets.delete_object(e, o)
      end

      assert Enum.sort(Heft.tab2list(t)) == Enum.sort(:ets.tab2list(e)), "#{type}"
      assert Heft.info(t, :size) == :ets.info(e, :size)

      for i <- Enum.take_random(1..3_100, 500) do
        assert Enum.sort(Heft.lookup(t, i)) == Enum.sort(:ets.lookup(e, i)), "#{type} #{i}"
        assert Heft.member(t, i) == :ets.member(e, i)
      end

      spec = [{{:"$1", :"$2", :_}, [{:<, :"$1", 500}], [{{:"$1", :"$2"}}]}]
      assert Enum.sort(Heft.select(t, spec)) == Enum.sort(:ets.select(e, spec))

      assert Heft.select_count(t, [{{:_, 1, :_}, [], [true]}]) ==
               :ets.select_count(e, [{{:_, 1, :_}, [], [true]}])

      if type == :ordered_set do
        assert Heft.first(t) == :ets.first(e) and Heft.last(t) == :ets.last(e)
      end

      # Emptied, nothing is left in the file.
      Heft.delete_all_objects(t)
      assert Heft.info(t, :tier).file_live_bytes == 0
      Heft.delete(t)
      :ets.delete(e)
    end
  end

  test "info/1 counts both tiers, and the file goes with the table", %{tmp_dir: dir} do
    t = Heft.new(:tiered, arena: {:file, dir, memory: @budget})
    assert {:file, path, [memory: @budget]} = Heft.info(t, :arena)
    assert Path.dirname(path) == Path.expand(dir)
    assert %{memory_budget: @budget, file_live_bytes: 0, moved_records: 0} = Heft.info(t, :tier)
    assert Heft.info(Heft.new(:plain, []), :tier) == nil

    for i <- 1..2_000, do: Heft.insert(t, record(i, 0))
    tier = moved(t)
    info = Heft.info(t)
    assert info[:arena_live_bytes] == tier.memory_live_bytes + tier.file_live_bytes
    assert info[:arena_used_bytes] == tier.memory_used_bytes + tier.file_used_bytes
    assert info[:memory] == info[:index_bytes] + info[:meta_bytes] + info[:arena_used_bytes]
    assert tier.queue_bytes <= info[:meta_bytes]
    # Resident: memory's pages and the file's in the page cache (just
    # written: all of what it holds, give or take a page a block).
    assert info[:arena_resident_bytes] >= tier.memory_live_bytes + div(tier.file_live_bytes, 2)
    # Lookups count what they found in the file.
    for i <- 1..2_000, do: Heft.lookup(t, i)
    assert Heft.info(t, :tier).file_reads > tier.file_reads
    # The file holds what memory does not, and no more.
    assert File.stat!(path).size >= tier.file_used_bytes
    Heft.delete(t)
    assert File.ls!(dir) == []
  end

  test "a persistent table keeps its working copy in a tiered arena and reopens whole",
       %{tmp_dir: dir} do
    pdir = Path.join(dir, "table")
    adir = Path.join(dir, "arena")
    File.mkdir_p!(adir)
    arena = {:file, adir, memory: @budget}
    t = Heft.new(:persistent_tiered, persist: pdir, arena: arena, sync: :commit)
    objs = for i <- 1..3_000, do: record(i, 0)
    Enum.each(objs, &Heft.insert(t, &1))
    for i <- 1..3_000//2, do: Heft.delete(t, i)
    left = Enum.reject(objs, fn {i, _, _} -> rem(i, 2) == 1 end)
    assert moved(t).file_live_bytes > 0
    assert Enum.sort(Heft.tab2list(t)) == left
    :ok = Heft.close(t)
    assert File.ls!(adir) == []

    # Loaded into memory up to the budget and an eighth, the rest into
    # the file, then the mover's work.
    {:ok, t} = Heft.open(pdir, arena: arena)
    assert {:file, _, [memory: @budget]} = Heft.info(t, :arena)
    tier = Heft.info(t, :tier)
    assert tier.memory_live_bytes <= @budget + div(@budget, 8) + 4096, inspect(tier)
    assert tier.file_live_bytes > 0
    assert Enum.sort(Heft.tab2list(t)) == left

    assert Enum.all?(Enum.take_random(left, 300), fn {k, _, _} = o -> Heft.lookup(t, k) == [o] end)

    :ok = Heft.close(t)

    # Reopened without the option: all in memory, as before.
    {:ok, t} = Heft.open(pdir)
    assert Heft.info(t, :arena) == :memory and Heft.info(t, :size) == length(left)
    Heft.delete(t)
  end

  test "once the index takes the memory budget, new keys are refused", %{tmp_dir: dir} do
    t = Heft.new(:pinned, arena: {:file, dir, memory: 64 * 1024})

    n =
      Enum.reduce_while(1..1_000_000, 0, fn i, n ->
        case Heft.insert(t, {i}) do
          true -> {:cont, n + 1}
          {:error, :memory_budget} -> {:halt, n}
        end
      end)

    assert n > 0 and Heft.info(t, :size) == n
    assert Heft.insert(t, {n + 1}) == {:error, :memory_budget}
    assert Heft.insert_new(t, {n + 1}) == {:error, :memory_budget}
    assert Heft.lookup(t, n + 1) == []
    # Keys already there: written, and deleted to make room (the index
    # shrinks once it is a quarter full).
    assert Heft.insert(t, [{1}, {2}]) == true
    for i <- 1..(n - div(n, 10)), do: Heft.delete(t, i)
    assert Wait.until(fn -> Heft.insert(t, {n + 1}) == true end)
  end

  test "bad options are refused", %{tmp_dir: dir} do
    for bad <- [
          {:file, dir, memory: 0},
          {:file, dir, memory: -1},
          {:file, dir, memory: :a},
          {:file, dir, []},
          {:file, dir, [memory: 1, other: 2]},
          {:file, dir, memory: 2 ** 63}
        ] do
      assert_raise ArgumentError, ~r/:arena/, fn -> Heft.new(:bad, arena: bad) end
    end

    assert_raise ArgumentError, ~r/not an existing directory/, fn ->
      Heft.new(:bad, arena: {:file, Path.join(dir, "nope"), memory: 1024})
    end
  end
end
