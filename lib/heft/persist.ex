defmodule Heft.Persist do
  @moduledoc false
  # Persistent tables, the Elixir half (the Rust half is
  # native/heft_nif/src/persist.rs over native/heft_core/src/durability/persist.rs):
  # persistence options of Heft.new/2 and Heft.open/2, and the META blob.
  #
  # META holds the table's options so that Heft.open/2 can reopen a table
  # after a VM restart without being told them: the external term format of
  # a map (docs/persistence-format.md, "META"), with the keys
  # `:format, :name, :type, :named, :keypos, :protection, :compression,
  # :compression_level, :sync, :dump_log_write_threshold,
  # :dump_log_time_threshold, :zero_keys`. The heir is not stored (pids do not survive
  # a restart). `:type` is any table type Heft.new/2 accepts.

  alias Heft.Native

  @keys [:persist, :sync, :dump_log_write_threshold, :dump_log_time_threshold, :repair]
  @defaults %{
    sync: :none,
    dump_log_write_threshold: 50_000,
    dump_log_time_threshold: 180_000,
    repair: false
  }
  @format 1

  # Splits Heft.new/2's options into the persistence ones (a map, or nil
  # without :persist) and the rest.
  def split_options(opts) do
    {mine, rest} = Enum.split_with(opts, &(is_tuple(&1) and elem(&1, 0) in @keys))

    case Map.new(mine, &pair/1) do
      empty when empty == %{} ->
        {nil, rest}

      %{persist: _} = p ->
        {Map.merge(@defaults, p), rest}

      p ->
        [key | _] = Map.keys(p)
        raise ArgumentError, "option #{inspect(key)} needs the option :persist"
    end
  end

  defp pair({:persist, dir} = opt) when is_binary(dir) or is_list(dir) do
    case IO.chardata_to_string(dir) do
      "" -> bad(opt)
      dir -> {:persist, Path.expand(dir)}
    end
  rescue
    ArgumentError -> bad(opt)
  end

  defp pair({:sync, mode} = opt) do
    if valid_sync?(mode), do: opt, else: bad(opt)
  end

  defp pair({k, n} = opt)
       when k in [:dump_log_write_threshold, :dump_log_time_threshold] and is_integer(n) and
              n >= 1,
       do: opt

  defp pair({:repair, b} = opt) when is_boolean(b), do: opt
  defp pair(opt), do: bad(opt)

  defp bad({key, _} = opt),
    do: raise(ArgumentError, "option #{inspect(key)} has an invalid value: #{inspect(opt)}")

  # Heft.new/2 with :persist: loads the table in the directory, or creates
  # it there. Raises like Heft.new/2.
  def new!(name, o, args, p) do
    meta = meta(name, o, p)

    stored =
      case Native.persist_meta_io(p.persist) do
        {:ok, blob} -> check_compatible!(decode_meta(blob), meta, p.persist)
        {:error, _} -> nil
      end

    case open_native(name, args, p, meta, true) |> settled(stored) do
      {:ok, tab} ->
        tab

      {:error, reason} ->
        raise Heft.Error, reason: reason, action: "open the table in #{p.persist}"
    end
  end

  # The stored META, if readable (the open reports it otherwise).
  defp check_compatible!({:ok, stored}, meta, dir) do
    for key <- [:type, :keypos], stored[key] != meta[key] do
      raise ArgumentError,
            "option :persist: the table in #{dir} has #{key} #{inspect(stored[key])}, " <>
              "not #{inspect(meta[key])}"
    end

    stored
  end

  defp check_compatible!(_unreadable, _meta, _dir), do: nil

  # How the table's keys that hold a float zero are stored (META's
  # :zero_keys, docs/persistence-format.md): :merged where 0.0 =:= -0.0
  # (OTP 26 and older: a key holding -0.0 is stored with 0.0), :distinct
  # where they differ (OTP 27 and later).
  defp zero_keys, do: if(Heft.VM.fact(:neg_zero_is_zero), do: :merged, else: :distinct)

  # A table just opened, whose META (`stored`, nil for a new table) says
  # it was written under the other zero rule (or does not say, written by
  # an older Heft): its misfiled records move to their keys on this VM
  # (native/heft_nif/src/migrate.rs) and META then records this VM's rule.
  # Where keys that were two are one on this VM and moving would lose an
  # object, the table is closed, unchanged: {:error, :zero_key_conflict}.
  defp settled({:ok, tab}, %{} = stored) do
    current = zero_keys()
    ref = with %Heft.Table{ref: ref} <- tab, do: ref

    cond do
      Map.get(stored, :zero_keys) == current ->
        {:ok, tab}

      current == :merged and zero_keys_pass(ref, false) |> elem(1) > 0 ->
        _ = Native.persist_close_io(ref, false)
        {:error, :zero_key_conflict}

      true ->
        _ = zero_keys_pass(ref, true)
        meta = :erlang.term_to_binary(Map.put(stored, :zero_keys, current))

        case Native.persist_write_meta_io(ref, meta) do
          :ok ->
            {:ok, tab}

          {:error, _} = error ->
            _ = Native.persist_close_io(ref, false)
            error
        end
    end
  end

  defp settled(opened, _stored), do: opened

  # {misfiled, conflicts} over the whole table, moving the misfiled
  # records with `apply`.
  defp zero_keys_pass(ref, apply, cursor \\ :start, acc \\ {0, 0}) do
    {misfiled, conflicts, next} = Native.zero_keys_cpu(ref, cursor, apply)
    acc = {elem(acc, 0) + misfiled, elem(acc, 1) + conflicts}

    if next == :"$end_of_table",
      do: acc,
      else: zero_keys_pass(ref, apply, next, acc)
  end

  # Heft.open/2: raises ArgumentError for a bad argument or option, before
  # it touches the directory.
  def open(dir, opts) do
    dir = Path.expand(Heft.Args.filename!(dir, "Heft.open/2"))
    opts = Heft.Args.options!(opts, "Heft.open/2", open_options())
    open_checked(dir, opts)
  end

  defp open_checked(dir, opts) do
    with {:ok, blob} <- Native.persist_meta_io(dir),
         {:ok, m} <- decode_meta(blob) do
      name = Keyword.get(opts, :name, m.name)
      table_opts = [m.type, m.protection, {:keypos, m.keypos}, {:compression, m.compression}]

      table_opts =
        if m.compression == :zlib,
          do: table_opts ++ [{:compression_level, m.compression_level}],
          else: table_opts

      table_opts = if m.named, do: [:named_table | table_opts], else: table_opts

      heir =
        case Keyword.get(opts, :heir, :none) do
          :none -> [{:heir, :none}]
          {pid, data} -> [{:heir, pid, data}]
        end

      persist = [persist: dir] ++ Keyword.take(opts, @keys -- [:persist])

      stored = [
        sync: m.sync,
        dump_log_write_threshold: m.dump_log_write_threshold,
        dump_log_time_threshold: m.dump_log_time_threshold
      ]

      {p, []} = split_options(Keyword.merge(stored, persist))
      budget = Keyword.take(opts, [:max_bytes, :max_records, :ttl, :arena])
      {o, args} = Heft.__parse_options__(table_opts ++ heir ++ budget)
      open_native(name, args, p, meta(name, o, p), false) |> settled(m)
    end
  rescue
    e in ArgumentError -> {:error, {:badarg, e.message}}
  end

  defp open_options do
    local_pid? = &(is_pid(&1) and node(&1) == node())
    bound? = &(&1 == nil or (is_integer(&1) and &1 > 0))

    [
      name: &is_atom/1,
      heir:
        &(&1 == :none or (match?({pid, _data} when is_pid(pid), &1) and local_pid?.(elem(&1, 0)))),
      sync: &valid_sync?/1,
      dump_log_write_threshold: &(is_integer(&1) and &1 >= 1),
      dump_log_time_threshold: &(is_integer(&1) and &1 >= 1),
      repair: &is_boolean/1,
      max_bytes: bound?,
      max_records: bound?,
      ttl: &Heft.Args.table_ttl?/1,
      arena: &Heft.Args.arena?/1
    ]
  end

  defp valid_sync?(mode),
    do: mode in [:none, :commit] or match?({:interval, ms} when is_integer(ms) and ms >= 1, mode)

  defp open_native(name, args, p, meta, create) do
    popts = {p.sync, p.dump_log_write_threshold, p.dump_log_time_threshold, p.repair, create}

    Native.persist_open_io(name, args, p.persist, popts, :erlang.term_to_binary(meta))
  rescue
    e in ArgumentError ->
      if e.message =~ "already exists",
        do: {:error, :name_taken},
        else: reraise(e, __STACKTRACE__)
  end

  defp meta(name, o, p) do
    %{
      format: @format,
      name: name,
      type: Map.get(o, :type, :set),
      named: o.named,
      keypos: o.keypos,
      protection: o.protection,
      compression: o.compression,
      compression_level: o.level,
      sync: p.sync,
      dump_log_write_threshold: p.dump_log_write_threshold,
      dump_log_time_threshold: p.dump_log_time_threshold,
      zero_keys: zero_keys()
    }
  end

  # The META blob is our own file (0600, checksummed); it may name atoms
  # this VM has not seen yet (the table's name), so it is decoded without
  # :safe, and every field is checked.
  defp decode_meta(blob) do
    case :erlang.binary_to_term(blob) do
      %{format: @format, name: n, type: t, named: nd, keypos: k, protection: pr} = m
      when is_atom(n) and is_atom(t) and is_boolean(nd) and is_integer(k) and k >= 1 and
             pr in [:public, :protected, :private] ->
        {:ok, m}

      %{format: f} when is_integer(f) and f > @format ->
        {:error, {:unsupported_version, "META", f}}

      _ ->
        {:error, {:corrupt, "META", 0}}
    end
  rescue
    ArgumentError -> {:error, {:corrupt, "META", 0}}
  end

  # After Heft.rename/2 (`:name`) and Heft.setopts/2 (`:protection`):
  # stores the table's new `key` in META, so that Heft.open/2 reopens the
  # table with it. Raises Heft.Error if it cannot.
  def stored(ref, key, value) when key in [:name, :protection] do
    case Native.persist_info(ref) do
      nil -> :ok
      %{persist: dir} -> store_meta(ref, dir, key, value)
    end
  end

  defp store_meta(ref, dir, key, value) do
    with {:ok, blob} <- Native.persist_meta_io(dir),
         {:ok, meta} <- decode_meta(blob),
         :ok <- Native.persist_write_meta_io(ref, :erlang.term_to_binary(%{meta | key => value})) do
      :ok
    else
      {:error, reason} -> raise Heft.Error, reason: reason, action: "store the table's #{key}"
    end
  end

  @items [
    :persist,
    :sync,
    :dump_log_write_threshold,
    :dump_log_time_threshold,
    :log_fsyncs,
    :log_bytes,
    :log_records,
    :log_batches,
    :log_segments,
    :commits,
    :dumps,
    :log_pending_records,
    :overloaded,
    :dumping,
    :poisoned,
    :recovered_snapshot_records,
    :recovered_log_records,
    :recovered_torn_bytes,
    :repaired
  ]

  def items, do: @items

  # The persistence items of info/1, in order ([] for a table in memory).
  def info(ref) do
    case Native.persist_info(ref) do
      nil -> []
      map -> Enum.map(@items, &{&1, Map.fetch!(map, &1)})
    end
  end

  # One item (nil for a table in memory).
  def info(ref, item) do
    case Native.persist_info(ref) do
      nil -> nil
      map -> Map.fetch!(map, item)
    end
  end
end
