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
      # What the VM mapped holds its carriers. (How small the unexplained
      # rest is depends on what the VM ran before: memory_accounting_test
      # measures it in a VM of its own.)
      assert n.erlang_mapped >= n.erlang_carriers
      assert p.files == n.mappings.file.rss
    end

    test "RSS agrees with ps(1) for this OS process" do
      n = Memory.node()
      assert n.os_pid == String.to_integer(System.pid())

      case System.find_executable("ps") do
        nil ->
          assert n.rss > 0

        ps ->
          {out, 0} = System.cmd(ps, ["-o", "rss=", "-p", System.pid()])
          assert_in_delta n.rss, String.to_integer(String.trim(out)) * 1024, n.rss * 0.1
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

    test "kind/1" do
      assert Beam.kind("/memfd:heft:users (deleted)") == :heft_arena
      assert Beam.kind("/memfd:heft-index:users (deleted)") == :heft_index
      assert Beam.kind("[anon:heft-index:users]") == :heft_index
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
      before = :erlang.memory(:ets)
      t = :ets.new(:heft_memory_test, [:set, :public])
      :ets.insert(t, for(i <- 1..50_000, do: {i, "value-#{i}", [i, i]}))
      grown = :erlang.memory(:ets) - before

      entry = Enum.find(Memory.ets().ets, &(&1.id == t))
      assert entry.bytes == :ets.info(t, :memory) * :erlang.system_info(:wordsize)
      assert entry.size == 50_000 and entry.owner == self()
      # :erlang.memory(:ets) is in bytes: the table's growth in bytes, not
      # half of it (words x 4) or a word count. It also counts ets_alloc's
      # own block overhead and any other table that grew meanwhile (~6%).
      assert_in_delta entry.bytes, grown, grown * 0.1
      :ets.delete(t)
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
end
