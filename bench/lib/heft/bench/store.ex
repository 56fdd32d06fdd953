defmodule Heft.Bench.Store do
  # The stores the bench compares, each behind the same small adapter so the
  # cell runner (Heft.Bench.Cell) treats them alike. A store is a name, an
  # adapter module and its options; adding a store is one line in @stores,
  # adding a kind of store is one adapter module.
  #
  # Records are `{key, value}`; `lookup/2` returns the store's own list of
  # records (Mnesia's carry the table name first).
  @moduledoc false

  @type state :: term
  @callback check(keyword) :: :ok | {:skip, String.t()}
  @callback open(keyword, dir :: Path.t()) :: state
  @callback insert(state, tuple) :: term
  @callback insert_many(state, [tuple]) :: term
  @callback lookup(state, term) :: [tuple]
  # Bytes, by the store's own accounting.
  @callback memory(state) :: non_neg_integer
  # How memory/1 counts, for the notes under the table.
  @callback accounting(keyword) :: String.t()
  # A store limit that a cell's predicted size must stay under.
  @callback limit(keyword) :: nil | {non_neg_integer, String.t()}
  # Persistent stores: close/1 flushes and closes, reopen/3 loads from disk.
  @callback persistent?(keyword) :: boolean
  @callback close(state) :: term
  @callback reopen(state, keyword, Path.t()) :: state
  @callback destroy(state) :: term
  # After the timed inserts, before memory and lookups are measured: bring
  # the store to the state it is measured in (a dictionary table: trained,
  # its records re-compressed); a note for the results, or nil.
  @callback settle(state, keyword) :: String.t() | nil
  # {raw, stored} payload bytes by the store's own accounting, or nil.
  @callback payload(state) :: {non_neg_integer, non_neg_integer} | nil
  @optional_callbacks settle: 2, payload: 1

  alias Heft.Bench.Store

  @stores [
    {"ets", Store.Ets, []},
    {"ets_compressed", Store.Ets, [:compressed]},
    {"mnesia", Store.Mnesia, []},
    {"dets", Store.Dets, []},
    {"heft_zlib", Store.Heft, compression: :zlib, arena: :memory},
    {"heft_none", Store.Heft, compression: :none, arena: :memory},
    {"heft_zstd", Store.Heft, compression: :zstd, arena: :memory},
    {"heft_zstd_dict", Store.Heft, compression: {:zstd, dictionary: :auto}, arena: :memory},
    {"heft_lz4", Store.Heft, compression: :lz4, arena: :memory},
    {"heft_file", Store.Heft, compression: :zlib, arena: :file},
    {"heft_sync_none", Store.Heft, compression: :zlib, sync: :none},
    {"heft_sync_interval", Store.Heft, compression: :zlib, sync: {:interval, 100}},
    {"heft_sync_commit", Store.Heft, compression: :zlib, sync: :commit}
  ]

  def names, do: Enum.map(@stores, &elem(&1, 0))

  # {adapter, options} of a store by name.
  def fetch!(name) do
    case List.keyfind(@stores, name, 0) do
      {_, mod, opts} ->
        {mod, opts}

      nil ->
        raise ArgumentError, "unknown store #{inspect(name)}; known: #{Enum.join(names(), ", ")}"
    end
  end

  def check(name) do
    {mod, opts} = fetch!(name)
    mod.check(opts)
  end

  def wordsize, do: :erlang.system_info(:wordsize)
end

defmodule Heft.Bench.Store.Ets do
  @moduledoc false
  @behaviour Heft.Bench.Store

  @impl true
  def check(_), do: :ok
  @impl true
  def open(opts, _dir), do: :ets.new(:bench, [:set, :public | opts])
  @impl true
  def insert(t, rec), do: :ets.insert(t, rec)
  @impl true
  def insert_many(t, recs), do: :ets.insert(t, recs)
  @impl true
  def lookup(t, key), do: :ets.lookup(t, key)
  @impl true
  def memory(t), do: :ets.info(t, :memory) * Heft.Bench.Store.wordsize()
  @impl true
  def accounting(_), do: "`:ets.info(t, :memory)` words × word size"
  @impl true
  def limit(_), do: nil
  @impl true
  def persistent?(_), do: false
  @impl true
  def close(_), do: :ok
  @impl true
  def reopen(t, _, _), do: t
  @impl true
  def destroy(t), do: :ets.delete(t)
end

defmodule Heft.Bench.Store.Mnesia do
  # Mnesia `disc_copies`, single node, schema in the cell's own directory,
  # `dirty_write` per record; a batch is one transaction of 1,000 writes.
  # Overload events ("Mnesia is overloaded") are subscribed to and counted by
  # the cell rather than logged.
  #
  # :mnesia is called through mnesia/0 so that the library need not declare
  # the :mnesia application just for the bench; the cell starts it.
  @moduledoc false
  @behaviour Heft.Bench.Store

  defp mnesia, do: :mnesia

  @impl true
  def check(_) do
    if Code.ensure_loaded?(mnesia()),
      do: :ok,
      else: {:skip, "the :mnesia application is not installed"}
  end

  @impl true
  def open(_opts, dir) do
    if mnesia().system_info(:is_running) != :yes do
      :ok = :application.set_env(:mnesia, :dir, String.to_charlist(Path.join(dir, "mnesia")))
      :ok = mnesia().create_schema([node()])
      start()
    end

    {:atomic, :ok} =
      mnesia().create_table(:bench, disc_copies: [node()], attributes: [:key, :value])

    :bench
  end

  defp start do
    {:ok, _} = :application.ensure_all_started(:mnesia)
    {:ok, _} = mnesia().subscribe(:system)
  end

  @impl true
  def insert(t, {k, v}), do: mnesia().dirty_write({t, k, v})
  @impl true
  def insert_many(t, recs) do
    {:atomic, :ok} =
      mnesia().transaction(fn -> Enum.each(recs, fn {k, v} -> mnesia().write({t, k, v}) end) end)
  end

  @impl true
  def lookup(t, key), do: mnesia().dirty_read(t, key)
  @impl true
  def memory(t), do: mnesia().table_info(t, :memory) * Heft.Bench.Store.wordsize()
  @impl true
  def accounting(_), do: "`:mnesia.table_info(t, :memory)` words × word size (the RAM copy)"
  @impl true
  def limit(_), do: nil
  @impl true
  def persistent?(_), do: true
  @impl true
  def close(_), do: :stopped = mnesia().stop()

  @impl true
  def reopen(t, _, _) do
    start()
    :ok = mnesia().wait_for_tables([t], :infinity)
    t
  end

  @impl true
  def destroy(t), do: {:atomic, :ok} = mnesia().delete_table(t)
end

defmodule Heft.Bench.Store.Dets do
  # DETS set in a file in the cell's directory. Its memory figure is the
  # file's size: DETS keeps records on disk. A DETS file cannot pass 2 GB.
  @moduledoc false
  @behaviour Heft.Bench.Store

  @impl true
  def check(_), do: :ok

  @impl true
  def open(_opts, dir) do
    file = Path.join(dir, "bench.dets")
    _ = File.rm(file)
    reopen(nil, [], dir)
  end

  @impl true
  def insert(t, rec), do: :ok = :dets.insert(t, rec)
  @impl true
  def insert_many(t, recs), do: :ok = :dets.insert(t, recs)
  @impl true
  def lookup(t, key), do: :dets.lookup(t, key)
  @impl true
  def memory(t), do: :dets.info(t, :file_size)
  @impl true
  def accounting(_), do: "file size on disk (`:dets.info(t, :file_size)`)"
  @impl true
  def limit(_), do: {2 * 1024 ** 3, "DETS files are limited to 2 GB"}
  @impl true
  def persistent?(_), do: true
  @impl true
  def close(t), do: :ok = :dets.close(t)

  @impl true
  def reopen(_, _, dir) do
    file = String.to_charlist(Path.join(dir, "bench.dets"))
    {:ok, t} = :dets.open_file(:bench, file: file, type: :set)
    t
  end

  @impl true
  def destroy(t) do
    file = :dets.info(t, :filename)
    :ok = :dets.close(t)
    File.rm!(file)
  end
end

defmodule Heft.Bench.Store.Heft do
  # Heft, with its compression, arena and persistence options. The API is
  # checked with function_exported?/3 and the store skipped, with the reason,
  # while a function it needs is missing. Heft is called through heft/0 so
  # that the bench compiles before the API exists.
  #
  # A dictionary store (`compression: {:zstd, dictionary: :auto}`) is
  # measured with its dictionary in use (settle/2): after the timed
  # inserts it waits for the table's own training (due at 4,096 records)
  # to finish, or, for a table that never got there, trains one with
  # Heft.train_dictionary/2; then it waits for the background
  # re-compression of the older records to end, and refuses to measure
  # (the cell fails) if more than 1% of the records are still plain zstd.
  # The note under the cell says which way the dictionary came and the
  # share of records compressed with it. Where the table puts no dictionary
  # in use (one must beat zstd alone on its samples: random bytes, bodies
  # too short to gain), the note says so and the cell measures the table
  # as it is (plain zstd or raw).
  @moduledoc false
  @behaviour Heft.Bench.Store

  defp heft, do: Heft

  @impl true
  def check(opts) do
    needed = [new: 2, insert: 2, lookup: 2, info: 2, delete: 1]
    needed = if persistent?(opts), do: needed ++ [close: 1, open: 1], else: needed
    Code.ensure_loaded(heft())

    case Enum.reject(needed, fn {f, a} -> function_exported?(heft(), f, a) end) do
      [] -> :ok
      [{f, a} | _] -> {:skip, "Heft API not present yet (no Heft.#{f}/#{a})"}
    end
  end

  @impl true
  def open(opts, dir), do: heft().new(:bench, heft_opts(opts, dir))

  defp heft_opts(opts, dir) do
    Enum.map(opts, fn
      {:arena, :file} -> {:arena, {:file, mkdir!(Path.join(dir, "arena"))}}
      {:sync, sync} -> {:sync, sync}
      other -> other
    end) ++ if(persistent?(opts), do: [persist: Path.join(dir, "heft")], else: [])
  end

  defp mkdir!(dir) do
    File.mkdir_p!(dir)
    dir
  end

  @impl true
  def insert(t, rec), do: heft().insert(t, rec)
  @impl true
  def insert_many(t, recs), do: heft().insert(t, recs)
  @impl true
  def lookup(t, key), do: heft().lookup(t, key)
  @impl true
  def memory(t), do: heft().info(t, :memory)
  @impl true
  def accounting(_), do: "`Heft.info(t, :memory)` (bytes)"
  @impl true
  def limit(_), do: nil
  @impl true
  def persistent?(opts), do: Keyword.has_key?(opts, :sync)
  @impl true
  def close(t), do: heft().close(t)
  @impl true
  def reopen(_, _, dir) do
    {:ok, t} = heft().open(Path.join(dir, "heft"))
    t
  end

  @impl true
  def destroy(t), do: heft().delete(t)

  @impl true
  def payload(t), do: {heft().info(t, :payload_raw_bytes), heft().info(t, :payload_stored_bytes)}

  # How long settle/2 waits for training and re-compression at most.
  @settle_ms 600_000
  @poll_ms 20
  # The share of records that may still be plain zstd once settled.
  @plain_share 0.01

  @impl true
  def settle(t, opts) do
    if dictionary?(opts), do: settle_dictionary(t)
  end

  defp dictionary?(opts) do
    case opts[:compression] do
      {:zstd, zo} -> zo[:dictionary] == :auto
      _ -> false
    end
  end

  defp settle_dictionary(t) do
    t0 = System.monotonic_time(:millisecond)
    # The table's own training is due at 4,096 records and runs on its own
    # thread: wait for it to have run (a dictionary, or none where it does
    # not beat zstd alone, or a failure).
    due = heft().info(t, :size) >= 4096
    wait(t0, fn -> not due or trained?(t) end)
    wait(t0, fn -> not busy?(t) end)

    how =
      cond do
        heft().info(t, :dictionaries) != [] ->
          {:ok, "trained by the table at 4,096 records" <> retrained(t)}

        due ->
          {:none, "the table's training"}

        true ->
          case heft().train_dictionary(t, []) do
            {:ok, id} when is_integer(id) ->
              {:ok, "trained by Heft.train_dictionary/2 (fewer than 4,096 records)"}

            other ->
              {:none, "Heft.train_dictionary/2 (#{inspect(other)})"}
          end
      end

    wait(t0, fn -> not busy?(t) end)
    by = heft().info(t, :records_by_codec)
    total = max(Enum.sum(Map.values(by)), 1)
    waited = System.monotonic_time(:millisecond) - t0

    case how do
      {:none, by_whom} ->
        "no dictionary: #{by_whom} found none that beats zstd alone " <>
          "(#{pct(by.raw, total)} raw, #{pct(by.zstd, total)} zstd)"

      {:ok, how} when by.zstd > @plain_share * total ->
        raise "dictionary #{how}, but #{pct(by.zstd, total)} of the records are still plain zstd"

      {:ok, how} ->
        "dictionary #{how}; #{pct(by.zstd_dict, total)} of the records with it, " <>
          "#{pct(by.raw, total)} raw (settled in #{waited} ms, not timed)"
    end
  end

  # The dictionaries the table trained on its own as it grew (the Heft
  # moduledoc, "Compression": one more due at each fourfold growth, used
  # only where it pays).
  defp retrained(t) do
    case length(heft().info(t, :dictionaries)) do
      1 -> ""
      n -> ", #{n - 1} more as it grew"
    end
  end

  # The table's training has run: a dictionary, or a finished or failed job.
  defp trained?(t),
    do:
      heft().info(t, :dictionaries) != [] or
        heft().info(t, :recompression).state in [:done, :failed]

  defp busy?(t), do: heft().info(t, :recompression).state in [:sampling, :training, :running]

  defp wait(t0, done?) do
    cond do
      done?.() ->
        :ok

      System.monotonic_time(:millisecond) - t0 > @settle_ms ->
        raise "dictionary training or re-compression still running after #{@settle_ms} ms"

      true ->
        Process.sleep(@poll_ms)
        wait(t0, done?)
    end
  end

  defp pct(n, total), do: "#{Float.round(100 * n / total, 1)}%"
end
