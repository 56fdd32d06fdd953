defmodule Heft.CompactionTest do
  # Tables that delete and overwrite give their memory back: compact/1 on
  # demand, the automatic runs a write starts, what info/1 says of them,
  # and that readers, writers, walks and continuations see every object
  # while records move (the engine's own tests are in heft_core's
  # table/compact.rs and arena/compact.rs).
  use ExUnit.Case, async: true

  @moduletag timeout: 180_000

  defp record(i, salt),
    do: {i, %{id: i, name: "user-#{i}", blob: :crypto.strong_rand_bytes(rem(i * 31 + salt, 200))}}

  # A table of `n` records with all but one in `keep` deleted, and the
  # survivors, sorted.
  defp churned(type, n, keep, opts \\ []) do
    t = Heft.new(:churned, [type, :public] ++ opts)
    for chunk <- Enum.chunk_every(1..n, 1000), do: Heft.insert(t, Enum.map(chunk, &record(&1, 0)))
    for i <- 1..n, rem(i, keep) != 0, do: Heft.delete(t, i)
    {t, Enum.sort(Heft.tab2list(t))}
  end

  # Waits up to 20 s for the table's automatic compactions to settle.
  defp settled(t, until \\ System.monotonic_time(:millisecond) + 20_000) do
    c = Heft.info(t, :compaction)

    cond do
      c.runs > 0 and c.state == :idle -> c
      System.monotonic_time(:millisecond) > until -> flunk("still compacting: #{inspect(c)}")
      true -> Process.sleep(20) && settled(t, until)
    end
  end

  test "a table that churned compacts on its own and keeps every object" do
    for type <- [:set, :ordered_set, :bag, :duplicate_bag] do
      {t, left} = churned(type, 60_000, 10)
      c = settled(t)
      info = Heft.info(t)
      assert c.moved_records > 0 and c.returned_bytes > 0, "#{type}: #{inspect(c)}"
      # What is left free was freed after the last run, too little for
      # another: under 1 MiB or a fifth of the arena.
      reclaimable = info[:arena_reclaimable_bytes]

      assert reclaimable < 1_048_576 or reclaimable * 5 < info[:arena_used_bytes],
             "#{type}: #{inspect(info)}"

      assert reclaimable <= info[:arena_free_bytes]
      assert info[:arena_used_bytes] <= info[:arena_live_bytes] + 1_048_576
      assert Enum.sort(Heft.tab2list(t)) == left, "#{type}"
      assert Enum.all?(Enum.take_random(left, 500), fn {k, _} = o -> o in Heft.lookup(t, k) end)
      Heft.delete(t)
    end
  end

  test "compact/1 says what it moved and returned, and info/1 keeps the totals" do
    t = Heft.new(:on_demand, [:public])
    assert {:ok, %{moved_records: 0, moved_bytes: 0, returned_bytes: 0}} = Heft.compact(t)
    # Under the automatic threshold: about 400 KB freed of 2 MB.
    for i <- 1..10_000, do: Heft.insert(t, record(i, 1))
    for i <- 1..10_000, rem(i, 5) == 0, do: Heft.delete(t, i)
    before = Heft.info(t)
    # The report shows what a compaction would give back.
    text = Heft.Report.render(Heft.Memory.snapshot(), tables: 1000, width: 200)
    assert text =~ "reclaimable"
    # The call above counts; no automatic one ran.
    assert before[:compaction].runs == 1
    assert before[:arena_free_bytes] > 0

    assert {:ok,
            %{
              moved_records: moved,
              moved_bytes: bytes,
              returned_bytes: returned,
              longest_lock_hold_us: held
            }} = Heft.compact(t)

    after_ = Heft.info(t)
    assert moved > 0 and bytes > 0
    assert returned == before[:arena_used_bytes] - after_[:arena_used_bytes]
    assert before[:memory] - after_[:memory] >= returned
    assert after_[:arena_free_bytes] == 0

    assert after_[:compaction] == %{
             state: :idle,
             runs: 2,
             moved_records: moved,
             moved_bytes: bytes,
             returned_bytes: returned,
             longest_lock_hold_us: held
           }

    assert Heft.info(t, :size) == 8_000
    assert {:ok, %{moved_records: 0, moved_bytes: 0, returned_bytes: 0}} = :heft.compact(t)
  end

  test "compact/1 needs read access" do
    t = Heft.new(:private_compact, [:private])
    for i <- 1..100, do: Heft.insert(t, {i})

    other =
      Task.async(fn ->
        try do
          Heft.compact(t)
        rescue
          e in ArgumentError -> {:raised, e.message}
        end
      end)

    assert {:raised, message} = Task.await(other)
    assert message =~ "private"
    assert {:ok, _} = Heft.compact(t)
    Heft.delete(t)
    assert_raise ArgumentError, fn -> Heft.compact(t) end
  end

  test "the pages a compaction gives back leave the process (smaps)" do
    {t, _left} = churned(:set, 100_000, 10)
    settled(t)
    info = Heft.info(t)
    # Resident arena memory follows the used bytes, not the high-water
    # mark (on huge pages, up to 2 MiB more).
    assert info[:arena_resident_bytes] <= info[:arena_used_bytes] + 2 * 1024 * 1024 + 4096,
           inspect(info)
  end

  test "readers, writers, walks and continuations see every object while records move" do
    for type <- [:set, :ordered_set, :bag] do
      t = Heft.new(:busy, [type, :public])
      e = :ets.new(:busy, [type, :public])
      objects = for i <- 1..40_000, do: record(i, 2)
      Heft.insert(t, objects)
      :ets.insert(e, objects)
      # Keys 1..20_000 stay as they are throughout; writers churn the rest.
      stable = for i <- 1..20_000, do: {i, hd(:ets.lookup(e, i))}
      for i <- 20_001..40_000, rem(i, 4) != 0, do: Heft.delete(t, i)
      {first, cont} = Heft.select(t, [{{:"$1", :_}, [{:"=<", :"$1", 20_000}], [:"$_"]}], 500)
      parent = self()

      writer =
        spawn_link(fn ->
          for round <- 1..3, i <- 20_001..40_000, rem(i, 3) == round - 1 do
            if rem(i, 2) == 0, do: Heft.delete(t, i), else: Heft.insert(t, record(i, round + 10))
          end

          send(parent, :written)
        end)

      # Lookups of the stable keys while the writer runs and the table
      # compacts (started by the writer's frees, and on demand).
      compactor = Task.async(fn -> Heft.compact(t) end)

      for _ <- 1..5, {k, o} <- Enum.take_random(stable, 2_000) do
        assert Heft.lookup(t, k) == [o]
      end

      # A walk started before, continued now.
      walked = first ++ drain(Heft.select(cont))
      assert Enum.sort(walked) == Enum.sort(for {_, o} <- stable, do: o), "#{type}"
      assert {:ok, _} = Task.await(compactor, 60_000)
      assert_receive :written, 60_000
      refute Process.alive?(writer)

      # The whole table against the writer's own view of it.
      stable_now = Heft.select(t, [{{:"$1", :_}, [{:"=<", :"$1", 20_000}], [:"$_"]}])
      assert Enum.sort(stable_now) == Enum.sort(for {_, o} <- stable, do: o)
      assert Heft.info(t, :size) == length(Heft.tab2list(t))
      :ets.delete(e)
      Heft.delete(t)
    end
  end

  defp drain(:"$end_of_table"), do: []
  defp drain({objects, cont}), do: objects ++ drain(Heft.select(cont))

  @tag :tmp_dir
  test "a persistent table compacts and reopens with every object", %{tmp_dir: dir} do
    dir = Path.join(dir, "persisted")
    t = Heft.new(:persisted_compaction, [:public, persist: dir])

    for chunk <- Enum.chunk_every(1..40_000, 1000),
        do: Heft.insert(t, Enum.map(chunk, &record(&1, 3)))

    for i <- 1..40_000, rem(i, 8) != 0, do: Heft.delete(t, i)
    left = Enum.sort(Heft.tab2list(t))
    settled(t)
    assert {:ok, _} = Heft.compact(t)
    assert Heft.info(t, :arena_free_bytes) == 0
    assert Heft.close(t) == :ok
    {:ok, t} = Heft.open(dir)
    assert Enum.sort(Heft.tab2list(t)) == left
    Heft.close(t)
  end

  @tag :tmp_dir
  test "a file arena's file is cut short", %{tmp_dir: dir} do
    {t, left} = churned(:set, 60_000, 10, arena: {:file, dir})
    settled(t)
    {:file, path} = Heft.info(t, :arena)
    assert File.stat!(path).size <= Heft.info(t, :arena_used_bytes) + 64 * 1024
    assert Enum.sort(Heft.tab2list(t)) == left
    # And it grows again.
    for i <- 70_001..80_000, do: Heft.insert(t, record(i, 4))
    assert Heft.info(t, :size) == length(left) + 10_000
    Heft.delete(t)
  end
end
