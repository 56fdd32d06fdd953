defmodule Heft.MemoryAccountingTest do
  # Does the node-wide view add up once real Heft tables hold real data,
  # and are the sizing predictions right at the issue's scale (1,000,000
  # records, checked by loading them)? Minutes and GiBs: tagged
  # :heft_accounting, excluded by default; run with
  #   mix test --include heft_accounting
  use ExUnit.Case, async: false

  alias Heft.Memory

  @moduletag :heft_accounting
  @moduletag timeout: :infinity

  @gib 1024 * 1024 * 1024
  @count 1_000_000

  @heft? Code.ensure_loaded?(Heft) and function_exported?(Heft, :all, 0)

  defp map_record(i), do: {i, %{id: i, name: "user-#{i}", age: rem(i, 90)}}
  defp tuple_record(i), do: {i, :erlang.make_tuple(100, List.duplicate(:a, 10))}

  defp samples(fun), do: Enum.map(Enum.take_random(1..@count, 1000), fun)

  # Loads `count` records in chunks (a million-element list of 17 KB
  # records would not fit beside the table), returns the table.
  defp load(insert, fun) do
    1..@count
    |> Stream.chunk_every(10_000)
    |> Enum.each(fn chunk -> insert.(Enum.map(chunk, fun)) end)
  end

  defp ets_bytes(fun, opts) do
    t = :ets.new(:heft_accounting, [:set, :public | opts])
    load(&:ets.insert(t, &1), fun)
    bytes = :ets.info(t, :memory) * :erlang.system_info(:wordsize)
    :ets.delete(t)
    bytes
  end

  defp within(predicted, actual, share) do
    assert_in_delta predicted,
                    actual,
                    actual * share,
                    "predicted #{predicted} bytes, loaded #{actual} (#{Float.round((predicted - actual) * 100 / actual, 1)}%)"
  end

  describe "sizing/3 at 1,000,000 records, ETS" do
    test "the map record, set and compressed set" do
      s = Memory.sizing(samples(&map_record/1), @count)
      within(s.ets.bytes, ets_bytes(&map_record/1, []), 0.15)
      within(s.ets_compressed.bytes, ets_bytes(&map_record/1, [:compressed]), 0.15)
    end

    test "the 100-tuple record, compressed set" do
      s = Memory.sizing(samples(&tuple_record/1), @count)
      within(s.ets_compressed.bytes, ets_bytes(&tuple_record/1, [:compressed]), 0.15)
    end

    # ~17 GB in a plain set: sharing is lost when records are copied in.
    # Loaded only when the host can spare it with 4 GiB to go.
    @tuple_ets Memory.sizing(
                 Enum.map(1..1000, &{&1, :erlang.make_tuple(100, List.duplicate(:a, 10))}),
                 @count
               ).ets.bytes
    if Memory.host().mem_available < @tuple_ets + 4 * @gib do
      @tag skip:
             "needs #{div(@tuple_ets, @gib) + 4} GiB available to load 1,000,000 100-tuple records in an ETS set"
    end

    test "the 100-tuple record, set" do
      s = Memory.sizing(samples(&tuple_record/1), @count)
      within(s.ets.bytes, ets_bytes(&tuple_record/1, []), 0.15)
    end
  end

  describe "with Heft tables" do
    unless @heft? do
      @describetag skip: "Heft's table API (Heft.new/2, insert/2, info/1, delete/1) is not there"
    end

    defp heft(fun, name, opts \\ []) do
      t = apply(Heft, :new, [name, [compression: :zlib, arena: :memory] ++ opts])
      load(&apply(Heft, :insert, [t, &1]), fun)
      t
    end

    defp info(t), do: Map.new(apply(Heft, :info, [t]))

    test "sizing/3's Heft prediction for both records" do
      for {fun, name} <- [{&map_record/1, :acc_map}, {&tuple_record/1, :acc_tuple}] do
        s = Memory.sizing(samples(fun), @count)
        t = heft(fun, name)
        within(s.heft.bytes, info(t).memory, 0.15)
        apply(Heft, :delete, [t])
      end
    end

    test "node/0: Heft's native memory is in the RSS, the parts add up" do
      before = Memory.node()
      t = heft(&map_record/1, :acc_node)
      i = info(t)
      n = Memory.node()

      assert n.heft.tables >= 1

      assert n.parts.erlang + n.parts.heft_index + n.parts.heft_arenas + n.parts.unexplained ==
               n.rss

      assert i.memory >= i.index_bytes
      # Stored payload lives in the arena, which :memory counts.
      assert i.payload_stored_bytes <= i.memory - i.index_bytes

      # The kernel's view of the arena mappings matches Heft's own figure
      # (both from smaps; a page per table of slack).
      assert_in_delta n.mappings.heft_arena.rss, n.heft.arena_resident_bytes, 4096 * n.heft.tables

      # What the RSS grew by is what Heft says it holds (index + resident
      # arena), give or take 10% and what the VM kept of the records it
      # built on its heap.
      grown = n.rss - before.rss

      heft_grown =
        n.parts.heft_index + n.parts.heft_arenas -
          (before.parts.heft_index + before.parts.heft_arenas)

      erlang_grown = n.parts.erlang - before.parts.erlang
      assert_in_delta grown, heft_grown + erlang_grown, heft_grown * 0.1 + 16 * 1024 * 1024

      apply(Heft, :delete, [t])
    end

    test "ets/0 lists the Heft table with its breakdown, in bytes" do
      t = heft(&map_record/1, :acc_ets)
      entry = Enum.find(Memory.ets().heft, &(&1.name == :acc_ets))
      assert entry.size == @count
      assert entry.memory == info(t).memory
      assert entry.arena == :memory
      apply(Heft, :delete, [t])
    end
  end
end
