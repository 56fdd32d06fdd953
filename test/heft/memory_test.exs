defmodule Heft.MemoryTest do
  use ExUnit.Case, async: false

  import Heft.Test.Fixtures
  alias Heft.Memory
  alias Heft.Memory.{Beam, Proc}

  @mib 1024 * 1024

  describe "node/0" do
    test "the parts add up to the RSS" do
      n = Memory.node()
      p = n.parts

      assert p.erlang + p.erlang_free + p.files + p.heft_index + p.heft_arenas + p.unexplained ==
               n.rss

      assert n.word_size == :erlang.system_info(:wordsize)
      assert n.erlang.total == p.erlang
      assert n.erlang_carriers >= n.erlang.ets
      # What the VM mapped holds its carriers, those it mapped itself: a
      # carrier may come from malloc instead (sys_alloc carriers, once an
      # allocator has as many mseg carriers as it may keep), and that one
      # is not in erts_mmap's figures. (How small the unexplained rest is
      # depends on what the VM ran before: memory_accounting_test measures
      # it in a VM of its own.) The two are read one after the other while
      # other processes allocate: one of a few reads must agree.
      assert Enum.any?(1..5, fn _ ->
               mseg = Beam.carrier_bytes(Memory.Source.local(), :mseg_alloc_carriers_size)
               Memory.node().erlang_mapped >= mseg
             end)

      assert p.files == n.mappings.file.rss
    end

    test "RSS agrees with ps(1) for this OS process" do
      n = Memory.node()
      assert n.os_pid == String.to_integer(System.pid())

      case System.find_executable("ps") do
        nil ->
          assert n.rss > 0

        ps ->
          # Other tests run meanwhile and move the RSS by tens of MB: ps's
          # reading is compared with the two taken either side of it, once
          # they agree.
          {before, by_ps, later} = steady_rss(ps, 5)
          assert_in_delta before, by_ps, before * 0.1
          assert_in_delta later, by_ps, later * 0.1
      end
    end

    test "the resident bytes by mapping kind cover the RSS" do
      n = Memory.node()
      m = n.mappings
      sum = m.anonymous.rss + m.file.rss + m.heft_arena.rss + m.heft_index.rss
      assert_in_delta sum, n.rss, n.rss * 0.05
    end

    test "without Heft its figures are nil, and so said" do
      unless Memory.Tables.heft_available?(Memory.Source.local()) do
        assert Memory.node().heft == nil
        assert Memory.ets().heft == nil
      else
        assert is_map(Memory.node().heft)
      end
    end

    test "a fixture root: RSS from smaps_rollup, or status on a 3.10 kernel" do
      assert Memory.node(root: machine("firecracker-v1")).rss == kib(53_516)
      n = Memory.node(root: machine("centos7-v1-limited"))
      assert n.rss == kib(1_258_291) and n.pss == nil and n.mappings == nil
    end
  end

  describe "mapping kinds" do
    test "Heft memory and file arenas are told apart from other mappings" do
      kinds = read!("smaps/arenas.smaps") |> Proc.smaps() |> Beam.classify()
      assert kinds.heft_arena.count == 2
      assert kinds.heft_arena.size == 96 * @mib
      assert kinds.heft_arena.rss == 22 * @mib
      assert kinds.heft_arena.dirty == 18 * @mib
      assert kinds.file.count > 0 and kinds.anonymous.count > 0
    end

    test "a named anonymous Heft arena is a Heft arena" do
      text = """
      7f00aa000000-7f00aa400000 rw-p 00000000 00:00 0                          [anon:heft:users]
      Size:               4096 kB
      Rss:                2048 kB
      Private_Dirty:      2048 kB
      AnonHugePages:      2048 kB
      7f00aa400000-7f00aa500000 rw-p 00000000 00:00 0
      Size:               1024 kB
      Rss:                 512 kB
      """

      kinds = text |> Proc.smaps() |> Beam.classify()

      assert kinds.heft_arena == %{
               count: 1,
               size: 4 * @mib,
               rss: 2 * @mib,
               dirty: 2 * @mib,
               swap: 0
             }

      assert kinds.anonymous.count == 1 and kinds.anonymous.rss == div(@mib, 2)
    end

    test "unnamed anonymous mappings at Heft arenas' addresses are named for them" do
      maps = [%{start: 1, path: nil}, %{start: 2, path: nil}, %{start: 3, path: "[heap]"}]
      named = Beam.name_arenas(maps, %{1 => "heft:users", 3 => "heft:x"})
      assert Enum.map(named, & &1.path) == ["[anon:heft:users]", nil, "[heap]"]
    end

    test "a live table's arena is a mapping of its own, counted as a Heft arena" do
      t = Heft.new(:memory_test_named_arena, compression: :none)
      Heft.insert(t, for(i <- 1..3000, do: {i, :binary.copy(<<i::32>>, 256)}))
      used = Heft.info(t, :arena_used_bytes)
      assert used > 3000 * 1024
      mapped = Heft.info(t, :arena_mapped_bytes)

      anon =
        for {start, "heft:memory_test_named_arena"} <- Heft.Native.anonymous_arenas(), do: start

      maps = File.read!("/proc/self/smaps") |> Proc.smaps()

      arena =
        case anon do
          [start] ->
            Enum.find(maps, &(&1.start == start))

          [] ->
            Enum.find(maps, &(&1.path == "/memfd:heft:memory_test_named_arena (deleted)"))
        end

      assert arena, "no mapping for the table's arena"
      assert arena.size == mapped
      [named] = Beam.name_arenas([arena], Map.new(Heft.Native.anonymous_arenas()))
      assert Beam.kind(named.path) == :heft_arena
      assert Memory.node().mappings.heft_arena.rss >= used
      assert Heft.info(t, :arena_resident_bytes) >= used
      Heft.delete(t)
    end

    test "kind/1" do
      assert Beam.kind("/memfd:heft:users (deleted)") == :heft_arena
      assert Beam.kind("/memfd:heft-index:users (deleted)") == :heft_index
      assert Beam.kind("[anon:heft:users]") == :heft_arena
      assert Beam.kind("[anon:heft-index:users]") == :heft_index
      assert Beam.kind("[anon:heftless]") == :anonymous
      assert Beam.kind("/srv/x/heft-00ff.arena") == :heft_arena
      assert Beam.kind("/srv/x/heft-00ff.arena (deleted)") == :heft_arena
      assert Beam.kind("/srv/x/notheft.arena") == :file
      assert Beam.kind("/memfd:vmem (deleted)") == :file
      assert Beam.kind("[heap]") == :anonymous
      assert Beam.kind(nil) == :anonymous
    end
  end

  describe "ets/0" do
    test "bytes are words times the word size, and match the VM's byte count" do
      # :erlang.memory(:ets) also moves with every other table (a table of
      # an exited test process is freed in the background, Mnesia's tables
      # come and go): a table large enough that they move it little, a few
      # tries, one of which must agree; bytes misread as words (or words
      # as half-words) never would.
      assert Enum.any?(1..5, fn _ -> ets_bytes_match_the_vm_growth() end)
    end

    defp ets_bytes_match_the_vm_growth do
      records = for i <- 1..200_000, do: {i, "value-#{i}", [i, i]}
      before = :erlang.memory(:ets)
      t = :ets.new(:heft_memory_test, [:set, :public])
      :ets.insert(t, records)
      grown = :erlang.memory(:ets) - before

      entry = Enum.find(Memory.ets().ets, &(&1.id == t))
      assert entry.bytes == :ets.info(t, :memory) * :erlang.system_info(:wordsize)
      assert entry.size == 200_000 and entry.owner == self()
      :ets.delete(t)
      # :erlang.memory(:ets) is in bytes: the table's growth in bytes, not
      # half of it (words x 4) or a word count. It also counts ets_alloc's
      # own block overhead (~6%).
      abs(entry.bytes - grown) <= grown * 0.2
    end

    test "largest first, owners named" do
      tables = Memory.ets().ets
      assert Enum.map(tables, & &1.bytes) == Enum.sort(Enum.map(tables, & &1.bytes), :desc)
      assert Enum.any?(tables, &(&1.owner_name == :code_server))
    end
  end

  describe "sizing/3 against loading the records" do
    defp load(records, opts) do
      t = :ets.new(:heft_sizing_check, [:set | opts])
      :ets.insert(t, records)
      bytes = :ets.info(t, :memory) * :erlang.system_info(:wordsize)
      :ets.delete(t)
      bytes
    end

    defp map_record(i), do: {i, %{id: i, name: "user-#{i}", age: rem(i, 90)}}
    defp tuple_record(i), do: {i, :erlang.make_tuple(100, List.duplicate(:a, 10))}

    test "the map record at 200,000, set and compressed set, within 15%" do
      count = 200_000
      samples = for i <- Enum.take_random(1..count, 1000), do: map_record(i)
      s = Memory.sizing(samples, count)
      records = for i <- 1..count, do: map_record(i)
      assert_in_delta s.ets.bytes, load(records, []), load(records, []) * 0.15
      compressed = load(records, [:compressed])
      assert_in_delta s.ets_compressed.bytes, compressed, compressed * 0.15
    end

    test "the 100-tuple record at 10,000, set and compressed set, within 15%" do
      count = 10_000
      samples = for i <- 1..1000, do: tuple_record(i)
      s = Memory.sizing(samples, count)
      plain = load(Enum.map(1..count, &tuple_record/1), [])
      assert_in_delta s.ets.bytes, plain, plain * 0.15
      compressed = load(Enum.map(1..count, &tuple_record/1), [:compressed])
      assert_in_delta s.ets_compressed.bytes, compressed, compressed * 0.15
      # Sharing is lost in ETS: each record is 100 x 10 list cells, not one.
      assert s.ets.bytes_per_record > 100 * 10 * 16
    end

    test "shares and verdicts against a given host" do
      samples = for i <- 1..100, do: map_record(i)
      host = %{mem_total: 1000 * @mib, mem_available: 900 * @mib, cgroup_limit: nil, cgroup: nil}
      s = Memory.sizing(samples, 1_000_000, host: host)
      assert s.ets.share_of_available == s.ets.bytes / (900 * @mib)
      assert s.ets.share_of_cgroup_limit == nil
      assert s.verdict == :fits

      tight = %{host | mem_available: 200 * @mib}

      assert Memory.sizing(samples, 1_000_000, host: tight).verdict in [
               :fits_in_heft_only,
               :does_not_fit
             ]
    end

    test "a cgroup limit is judged on its working set" do
      samples = for i <- 1..100, do: map_record(i)
      cg = %{limit: 256 * @mib, working_set: 100 * @mib, usage: 120 * @mib}

      host = %{
        mem_total: 64 * 1024 * @mib,
        mem_available: 60 * 1024 * @mib,
        cgroup_limit: cg.limit,
        cgroup: cg
      }

      s = Memory.sizing(samples, 1_000_000, host: host)
      assert s.ets.share_of_cgroup_limit == s.ets.bytes / (256 * @mib)
      # ~190 MB of ETS on top of 100 MiB in a 256 MiB cgroup: no.
      refute s.ets.fits
      assert s.ets_compressed.fits == 100 * @mib + s.ets_compressed.bytes <= 0.85 * 256 * @mib
    end

    test "refc binaries are counted outside the table" do
      samples = for i <- 1..100, do: {i, :binary.copy(<<i>>, 1000)}
      s = Memory.sizing(samples, 1000, host: Memory.host())
      assert s.ets.off_heap_binary_bytes == 1000 * 1000
      assert s.ets.bytes == s.ets.table_bytes + s.ets.off_heap_binary_bytes
    end

    test "without Heft the :heft entry is nil" do
      if Memory.Tables.heft_available?(Memory.Source.local()) do
        assert is_integer(Memory.sizing([{1, 2}], 10).heft.bytes)
      else
        assert Memory.sizing([{1, 2}], 10).heft == nil
      end
    end
  end

  describe "snapshot/0" do
    test "all the parts, warnings as data" do
      s = Memory.snapshot()
      assert s.node_name == node()
      assert s.host.mem_total > 0 and s.node.rss > 0 and is_list(s.tables.ets)
      assert is_list(s.warnings)

      assert Enum.all?(
               s.warnings,
               &match?(
                 {sev, code, msg}
                 when sev in [:error, :warning, :info] and is_atom(code) and is_binary(msg),
                 &1
               )
             )

      assert Memory.warnings(s) == s.warnings
    end

    test "Erlang callers use the same functions" do
      assert %{mem_total: t} = :"Elixir.Heft.Memory".host()
      assert t > 0
    end
  end

  defp steady_rss(ps, tries) do
    before = Memory.node().rss
    {out, 0} = System.cmd(ps, ["-o", "rss=", "-p", System.pid()])
    later = Memory.node().rss
    reading = {before, String.to_integer(String.trim(out)) * 1024, later}

    if tries > 1 and abs(later - before) > before * 0.02,
      do: steady_rss(ps, tries - 1),
      else: reading
  end
end
