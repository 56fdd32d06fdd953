defmodule Heft.Memory.Beam do
  # Builds the map Heft.Memory.node/0 returns (its @doc lists every key):
  # what the VM says it allocated, what the kernel says is resident, what
  # Heft holds natively, and the difference, so the parts add up to the RSS.
  #
  # Sources, all of the OS process the source describes:
  #   :erlang.memory/0           bytes allocated through ERTS allocators
  #   :erlang.system_info/1      word size; allocator carriers
  #   /proc/self/smaps_rollup    Rss, Pss, Anonymous, Swap (Linux 4.14+;
  #                              /proc/self/status VmRSS/VmSwap before that)
  #   /proc/self/smaps           per mapping: which resident bytes are Heft
  #                              arenas, other files (code, libraries) or
  #                              anonymous memory
  #   Heft tables                index and arena figures from Heft.info/1
  @moduledoc false

  alias Heft.Memory.{Proc, Source}

  def read(source, heft_tables) do
    word_size = Source.call(source, :erlang, :system_info, [:wordsize])
    erlang = Map.new(Source.call(source, :erlang, :memory, []))
    process = process(source)
    heft = heft(heft_tables)
    rss = process.rss
    # The carriers first, then what holds them: carriers made between the
    # two reads are mapped by the second, and freed ones stay mapped a
    # while (mseg's cache), so the figures agree though taken one by one.
    carriers = carrier_bytes(source, :carriers_size)
    mapped = erts_mapped(source)

    %{
      os_pid: Source.call(source, :os, :getpid, []) |> List.to_integer(),
      word_size: word_size,
      erlang: erlang,
      erlang_carriers: carriers,
      erlang_mapped: mapped,
      rss: rss,
      pss: process.pss,
      swap: process.swap,
      mappings: process.mappings,
      heft: heft,
      parts: parts(rss, erlang.total, mapped, process.mappings, heft)
    }
  end

  defp process(source) do
    case Source.read!(source, "/proc/self/smaps_rollup") do
      nil ->
        status = Proc.status(Source.read!(source, "/proc/self/status") || "")
        %{rss: status["VmRSS"], pss: nil, swap: status["VmSwap"], mappings: mappings(source)}

      text ->
        r = Proc.smaps_rollup(text)
        %{rss: r["Rss"], pss: r["Pss"], swap: r["Swap"], mappings: mappings(source)}
    end
  end

  # Resident bytes by kind of mapping. A Heft memory arena is anonymous
  # memory named "heft:<table>" (shown as "[anon:heft:<table>]"; where the
  # kernel does not name anonymous memory, the NIF lists it by address and
  # it is given that name here), or a memfd named "heft:<table>" (shown as
  # "/memfd:heft:<table> (deleted)") where the kernel has no huge pages for
  # it; a file arena is a file named heft-*.arena; a table's index is a
  # mapping named "heft-index:<table>" (anonymous, "[anon:heft-index:<table>]",
  # or a memfd where the kernel cannot name anonymous memory, and for an
  # ordered_set).
  # nil when smaps cannot be read.
  defp mappings(source) do
    names = arena_names(source)

    with text when is_binary(text) <- Source.read!(source, "/proc/self/smaps") do
      text |> Proc.smaps() |> name_arenas(names) |> classify()
    end
  end

  # %{start address => name} of the live VM's anonymous Heft arenas (none
  # for a machine's saved files, or where Heft is not loaded).
  defp arena_names(%Source{root: "/", heft?: true} = source) do
    if Source.exported?(source, Heft.Native, :anonymous_arenas, 0) do
      source |> Source.call(Heft.Native, :anonymous_arenas, []) |> Map.new()
    else
      %{}
    end
  end

  defp arena_names(_source), do: %{}

  # Gives unnamed anonymous mappings that are Heft arenas their name.
  @doc false
  def name_arenas(mappings, names) do
    Enum.map(mappings, fn
      %{path: nil, start: start} = m when is_map_key(names, start) ->
        %{m | path: "[anon:#{names[start]}]"}

      m ->
        m
    end)
  end

  @doc false
  def classify(mappings) do
    empty = %{count: 0, size: 0, rss: 0, dirty: 0, swap: 0}

    kinds = %{heft_arena: empty, heft_index: empty, file: empty, anonymous: empty}

    Enum.reduce(mappings, kinds, fn m, acc ->
      f = m.fields

      add = %{
        count: 1,
        size: m.size,
        rss: f["Rss"] || 0,
        dirty: (f["Shared_Dirty"] || 0) + (f["Private_Dirty"] || 0),
        swap: f["Swap"] || 0
      }

      Map.update!(acc, kind(m.path), &Map.merge(&1, add, fn _k, a, b -> a + b end))
    end)
  end

  @doc false
  def kind(nil), do: :anonymous
  def kind("/memfd:heft:" <> _), do: :heft_arena
  def kind("/memfd:heft-index:" <> _), do: :heft_index
  def kind("[anon:heft:" <> _), do: :heft_arena
  def kind("[anon:heft-index:" <> _), do: :heft_index
  # [heap], [stack], [vdso], [anon:name] and the like.
  def kind("[" <> _), do: :anonymous

  def kind(path) do
    if Regex.match?(~r{/heft-[^/]*\.arena( \(deleted\))?$}, path), do: :heft_arena, else: :file
  end

  defp heft(nil), do: nil

  defp heft(tables) do
    sum = fn key -> tables |> Enum.map(&(&1[key] || 0)) |> Enum.sum() end

    %{
      tables: length(tables),
      memory: sum.(:memory),
      index_bytes: sum.(:index_bytes),
      index_resident_bytes: sum.(:index_resident_bytes),
      dictionary_bytes: sum.(:dictionary_bytes),
      arena_mapped_bytes: sum.(:arena_mapped_bytes),
      arena_live_bytes: sum.(:arena_live_bytes),
      arena_resident_bytes: sum.(:arena_resident_bytes),
      arena_dirty_bytes: sum.(:arena_dirty_bytes),
      arena_swap_bytes: sum.(:arena_swap_bytes)
    }
  end

  defp parts(nil, _erlang, _mapped, _mappings, _heft), do: nil

  defp parts(rss, erlang_total, mapped, mappings, heft) do
    index = (heft && heft.index_resident_bytes) || 0
    arenas = (heft && heft.arena_resident_bytes) || 0
    free = max((mapped || erlang_total) - erlang_total, 0)
    files = (mappings && mappings.file.rss) || 0

    %{
      erlang: erlang_total,
      erlang_free: free,
      files: files,
      heft_index: index,
      heft_arenas: arenas,
      unexplained: rss - erlang_total - free - files - index - arenas
    }
  end

  # Bytes the VM has mapped from the OS for its allocators (erts_mmap: the
  # default mapper's OS mappings and the literal super carrier in use):
  # carriers, and the segments mseg_alloc keeps cached after their carriers
  # are freed. nil where the VM does not say (then the free part is 0).
  defp erts_mapped(source) do
    info = Source.call(source, :erlang, :system_info, [{:allocator, :erts_mmap}])
    os = get_in(info, [:default_mmap, :os, :sizes, :used])
    literal = get_in(info, [:literal_mmap, :supercarrier, :sizes, :used]) || 0
    if is_integer(os), do: os + literal
  rescue
    _ -> nil
  end

  # Bytes the ERTS alloc_util allocators hold from the OS in carriers (multi-
  # and single-block carriers of every instance, plus carriers parked in the
  # pool), as recon_alloc counts them, by the statistic `key`: all of them
  # (:carriers_size) or those mapped by mseg (:mseg_alloc_carriers_size) or
  # got from malloc (:sys_alloc_carriers_size). Mapped, not necessarily
  # resident.
  def carrier_bytes(source, key) do
    for a <- Source.call(source, :erlang, :system_info, [:alloc_util_allocators]),
        {:instance, _, info} <- instances(source, a),
        {kind, stats} <- info,
        kind in [:mbcs, :sbcs, :mbcs_pool],
        stat <- stats,
        elem(stat, 0) == key,
        reduce: 0 do
      acc -> acc + elem(stat, 1)
    end
  end

  defp instances(source, a) do
    case Source.call(source, :erlang, :system_info, [{:allocator, a}]) do
      list when is_list(list) -> list
      _ -> []
    end
  end
end
