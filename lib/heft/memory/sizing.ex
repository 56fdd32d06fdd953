defmodule Heft.Memory.Sizing do
  # Predicts what `count` records like the samples need, by storing the
  # samples for real and scaling (Heft.Memory.sizing/3 documents the result).
  #
  # ETS (set, and set with :compressed), in words times the word size:
  #   table(count) = probe(count) + count * (sample slope - probe slope)
  # probe(count) is a real table of `count` minimal records {i} with the
  # same options: the fixed overhead and the bucket array as it is at that
  # size (ETS is a linear hash table whose buckets grow with the records;
  # 1,000 samples never show that growth). The slopes (words per record from
  # half the samples to all of them, and for as many probe records) differ
  # only by what a sample record costs beyond a minimal one. The probe is
  # measured up to 1,000,000 records (~50 MB, under a second) and
  # extrapolated beyond.
  # Refc binaries (> 64 bytes) are not in ets:info memory: the table holds
  # a reference and the bytes live in binary_alloc, in ETS sets compressed
  # or not. They are counted separately from the samples' terms.
  #
  # Heft: a temporary memory-arena Heft table holds the samples; the arena
  # cost per record (info :memory minus :index_bytes) scales linearly. The
  # index is a hash table of 8-byte slots kept at most 80% full, growing by
  # half (native/heft_core/src/storage/index.rs): h home slots, h the first of 255,
  # 382, 573, ... (each the last plus half of it, rounded down) with
  # count <= 0.8 * h, plus a tail of min(h, 256) slots for probe runs past
  # the last home slot, and a byte per 64 slots. If the
  # table's own :index_bytes at the sample size (and empty) disagrees with
  # that rule, the rule is not trusted and the index is scaled per record
  # instead (:index_model says which).
  #
  # Codecs (:codecs): every compression a table can take, predicted by
  # compressing the samples for real (Heft.Native.sizing_predict, a dirty
  # CPU NIF; native/heft_core/src/memory/sizing.rs): the records as a new table
  # encodes them, each body compressed and laid out as the table would,
  # rounded to the arena's size classes; a dictionary codec with
  # dictionaries trained on three quarters of the samples and judged on the
  # fourth (four-fold), since a table compresses far more records than it
  # trains on. Per codec:
  #   bytes = arena_empty + count * arena blocks per record + dictionary
  #           memory + index(count)
  # with arena_empty and the index model those of the real table above.
  @moduledoc false

  alias Heft.Memory.Tables

  @slot_bytes 8
  @min_home_slots 255
  @max_tail_slots 256
  @max_load 0.8
  @headroom 0.85
  @proc_bin_threshold 64
  @probe_cap 1_000_000
  # The largest dictionary the codec predictions train (a table's default,
  # heft_core table/learn.rs DICT_BYTES); opts[:dictionary_bytes] sets
  # another.
  @dictionary_bytes 16 * 1024
  # zlib's level and zstd's (without, with a dictionary) when none is given
  # (Heft's defaults).
  @zlib_level 1
  @zstd_level 3
  @zstd_dict_level 9
  # The codecs predicted, by their Heft.new/2 option, and the compression
  # the NIF takes for each.
  @codecs [
    {:none, :none},
    {:zlib, {:zlib, @zlib_level}},
    {:lz4, :lz4},
    {:zstd, {:zstd, @zstd_level, false}},
    {{:zstd, dictionary: :auto}, {:zstd, @zstd_dict_level, true}}
  ]

  def run(samples, count, opts) do
    host = Keyword.get_lazy(opts, :host, fn -> Heft.Memory.host() end)
    headroom = Keyword.get(opts, :headroom, @headroom)
    word_size = :erlang.system_info(:wordsize)
    off_heap = off_heap_bytes(samples)

    entries = %{
      ets: ets(samples, count, [], word_size, off_heap),
      ets_compressed: ets(samples, count, [:compressed], word_size, off_heap),
      heft: heft(samples, count, opts)
    }

    entries = Map.new(entries, fn {k, e} -> {k, e && shares(e, host, headroom)} end)
    codecs = codecs(samples, count, entries.heft, opts)
    codecs = codecs && Enum.map(codecs, &shares(&1, host, headroom))

    Map.merge(entries, %{
      count: count,
      samples: length(samples),
      codecs: codecs,
      verdict: verdict(entries)
    })
  end

  defp ets(samples, count, extra, word_size, off_heap) do
    n = length(samples)
    {half, _} = Enum.split(samples, div(n, 2))
    # The samples' own slope (object cost) and a probe table's: same option,
    # same record counts, minimal records {i}.
    {empty, sample_slope, distinct} = slope(extra, half, samples)
    {_, probe_slope, _} = slope(extra, probe_records(1, div(n, 2)), probe_records(1, n))
    object_extra = sample_slope - probe_slope
    table = round((probe_words(extra, count) + object_extra * count) * word_size)
    binaries = round(off_heap / max(n, 1) * count)

    %{
      bytes: table + binaries,
      table_bytes: table,
      off_heap_binary_bytes: binaries,
      fixed_bytes: empty * word_size,
      bytes_per_record: (table - empty * word_size) / max(count, 1),
      distinct_samples: distinct
    }
  end

  # Words per record from growing a table from `first` to `all` records, and
  # the empty table's words. Fewer than two distinct keys leave no slope:
  # the whole growth is used instead.
  defp slope(extra, first, all) do
    with_table(extra, fn t ->
      empty = :ets.info(t, :memory)
      :ets.insert(t, first)
      {n1, w1} = {:ets.info(t, :size), :ets.info(t, :memory)}
      :ets.insert(t, all)
      {n2, w2} = {:ets.info(t, :size), :ets.info(t, :memory)}
      s = if n2 > n1, do: (w2 - w1) / (n2 - n1), else: (w2 - empty) / max(n2, 1)
      {empty, s, n2}
    end)
  end

  # Words of a table holding `count` minimal records: the table itself with
  # its bucket array at that size. Measured up to @probe_cap records,
  # extrapolated linearly (by the probe's own slope) beyond.
  defp probe_words(extra, count) do
    measured = min(count, @probe_cap)

    with_table(extra, fn t ->
      half = div(measured, 2)
      insert_probe(t, 1, half)
      w1 = :ets.info(t, :memory)
      insert_probe(t, half + 1, measured)
      w2 = :ets.info(t, :memory)
      beyond = count - measured
      if beyond > 0, do: w2 + (w2 - w1) / max(measured - half, 1) * beyond, else: w2
    end)
  end

  # In chunks: one insert per record is slow, one list of a million large.
  defp insert_probe(t, from, to) do
    from..to//10_000
    |> Enum.each(&:ets.insert(t, probe_records(&1, min(&1 + 9_999, to))))
  end

  defp probe_records(from, to) when to < from, do: []
  defp probe_records(from, to), do: Enum.map(from..to, &{&1})

  defp with_table(extra, fun) do
    t = :ets.new(:heft_sizing, [:set, :private | extra])

    try do
      fun.(t)
    after
      :ets.delete(t)
    end
  end

  defp heft(samples, count, opts) do
    if Tables.heft_available?(Heft.Memory.Source.local()), do: heft_measure(samples, count, opts)
  end

  defp heft_measure(samples, count, opts) do
    name = :"heft_sizing_#{System.unique_integer([:positive])}"
    # Called through apply/3: Heft's table API is not in every build this
    # module compiles against, and heft_available?/1 has checked it is here.
    t =
      apply(Heft, :new, [
        name,
        [compression: Keyword.get(opts, :compression, :zlib), arena: :memory]
      ])

    try do
      empty = Map.new(apply(Heft, :info, [t]))
      apply(Heft, :insert, [t, samples])
      full = Map.new(apply(Heft, :info, [t]))
      n = max(full.size, 1)
      arena_empty = empty.memory - empty.index_bytes
      arena_per_record = (full.memory - full.index_bytes - arena_empty) / n
      rule_holds = index_bytes(0) == empty.index_bytes and index_bytes(n) == full.index_bytes

      {model, index} =
        if rule_holds,
          do: {:doubling, index_bytes(count)},
          else: {:linear, round(full.index_bytes / n * count)}

      arena = round(arena_empty + arena_per_record * count)

      %{
        bytes: arena + index,
        arena_bytes: arena,
        arena_empty_bytes: arena_empty,
        index_bytes: index,
        index_model: model,
        bytes_per_record: arena_per_record,
        compression_ratio: ratio(full[:payload_raw_bytes], full[:payload_stored_bytes]),
        distinct_samples: full.size
      }
    after
      apply(Heft, :delete, [t])
    end
  end

  # Each codec's prediction (see the top of this module); nil without Heft.
  defp codecs(_samples, _count, nil, _opts), do: nil

  defp codecs(samples, count, heft, opts) do
    dictionary = Keyword.get(opts, :dictionary_bytes, @dictionary_bytes)
    {names, nif} = Enum.unzip(@codecs)

    predictions = apply(Heft.Native, :sizing_predict, [samples, 1, false, nif, dictionary])

    for {name, p} <- Enum.zip(names, predictions) do
      n = max(p.records, 1)
      arena = round(heft.arena_empty_bytes + p.arena_bytes / n * count + p.dictionary_memory)

      %{
        compression: name,
        bytes: arena + heft.index_bytes,
        arena_bytes: arena,
        index_bytes: heft.index_bytes,
        bytes_per_record: p.arena_bytes / n,
        stored_bytes_per_record: p.stored_bytes / n,
        compression_ratio: ratio(p.raw_bytes, p.stored_bytes),
        compressed_share: p.compressed / n,
        dictionary_trained: p.trained,
        dictionary_bytes: p.dictionary_bytes,
        dictionary_memory: p.dictionary_memory,
        decode_ns: p.decode_ns
      }
    end
  end

  defp ratio(raw, stored) when is_integer(raw) and is_integer(stored) and stored > 0,
    do: raw / stored

  defp ratio(_, _), do: nil

  # Index bytes of a table holding `n` records, by the rule above (the slot
  # array is a mapping of its own, so whole pages).
  defp index_bytes(n) do
    homes =
      Stream.iterate(@min_home_slots, &(&1 + div(&1, 2))) |> Enum.find(&(n <= @max_load * &1))

    slots = homes + min(homes, @max_tail_slots)
    bytes = slots * @slot_bytes + div(slots + 63, 64)
    div(bytes + 4095, 4096) * 4096
  end

  defp shares(entry, host, headroom) do
    avail = host[:mem_available]
    limit = host[:cgroup_limit]
    cg = host[:cgroup]
    bytes = entry.bytes

    fits_host =
      is_integer(host[:mem_total]) and is_integer(avail) and
        host.mem_total - avail + bytes <= headroom * host.mem_total

    fits_cgroup =
      not is_integer(limit) or (cg.working_set || cg.usage) + bytes <= headroom * limit

    Map.merge(entry, %{
      share_of_available: if(is_integer(avail) and avail > 0, do: bytes / avail),
      share_of_cgroup_limit: if(is_integer(limit) and limit > 0, do: bytes / limit),
      fits: fits_host and fits_cgroup
    })
  end

  defp verdict(%{ets: ets, ets_compressed: etc, heft: heft}) do
    cond do
      ets.fits or etc.fits -> :fits
      heft != nil and heft.fits -> :fits_in_heft_only
      true -> :does_not_fit
    end
  end

  # Bytes of refc binaries (> 64 bytes) in the samples: stored outside the
  # ETS table, in binary_alloc.
  defp off_heap_bytes(term) when is_binary(term) do
    if byte_size(term) > @proc_bin_threshold, do: byte_size(term), else: 0
  end

  defp off_heap_bytes(term) when is_tuple(term),
    do: term |> Tuple.to_list() |> off_heap_bytes()

  defp off_heap_bytes([h | t]), do: off_heap_bytes(h) + off_heap_bytes(t)

  defp off_heap_bytes(term) when is_map(term),
    do: Enum.reduce(term, 0, fn {k, v}, acc -> acc + off_heap_bytes(k) + off_heap_bytes(v) end)

  defp off_heap_bytes(_), do: 0
end
