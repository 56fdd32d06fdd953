defmodule Heft.Bench.Cell do
  # One cell of the matrix (store × record kind × record count), run in a
  # fresh OS process started by Heft.Bench so that no other store's garbage
  # is in its heap, allocators or RSS. It prints progress lines and, last,
  # one result line that the parent parses:
  #
  #   @@progress <phase> <done> <total>
  #   @@result <Base64 of :erlang.term_to_binary(result map)>
  #
  # Steps: a pilot of 1,000 records predicts the cell's size and time, and
  # skips it (with the reason) when it would pass 60% of the host's available
  # memory, a store limit, or the run's time budget; then N single inserts are
  # timed, the store settled (Store callback settle/2: a dictionary table
  # trained and re-compressed, not timed), memory read (the store's own bytes and this process's RSS growth),
  # 200,000 lookups (or as many as 2 s allow, at least 1,000) of
  # random keys timed, a persistent store closed and reopened (load time),
  # and N inserts in batches of 1,000 timed into a fresh table.
  @moduledoc false

  alias Heft.Bench.{Kinds, Store, Sys}

  @chunk 1_000
  @pilot 1_000
  @lookups 200_000
  @lookup_ms 2_000
  @mem_share 0.6
  @progress_every_ms 1_000

  # Entry point of the child process: `elixir -pa ... -e 'Heft.Bench.Cell.main()' -- SPEC`.
  def main do
    [arg] = System.argv()
    spec = arg |> Base.decode64!() |> :erlang.binary_to_term()
    # Mnesia reports overload as warnings; they are counted, not printed.
    :logger.set_primary_config(:level, :error)

    result =
      try do
        run(spec)
      catch
        kind, reason ->
          banner = Exception.format_banner(kind, reason, __STACKTRACE__)
          %{status: :error, reason: banner |> String.split("\n") |> hd()}
      end

    IO.puts("@@result " <> (result |> :erlang.term_to_binary() |> Base.encode64()))
  end

  def encode_spec(spec), do: spec |> :erlang.term_to_binary() |> Base.encode64()

  # A measure other than the matrix's (Heft.Bench.Measures).
  def run(%{measure: _} = spec), do: Heft.Bench.Measures.child(spec)

  def run(%{store: name, kind: kind, count: n, dir: dir} = spec) do
    {mod, opts} = Store.fetch!(name)
    File.rm_rf!(dir)
    File.mkdir_p!(dir)

    try do
      with :ok <- mod.check(opts),
           :ok <- pilot(mod, opts, kind, n, dir, spec) do
        t0 = now()
        Map.put(measure(mod, opts, kind, n, dir), :run_s, us(now() - t0) / 1.0e6)
      else
        {:skip, why, reason} -> %{status: :skip, why: why, reason: reason}
        {:skip, reason} -> %{status: :skip, why: :api, reason: reason}
      end
    after
      File.rm_rf(dir)
    end
  end

  # A run inserts N records twice (single, then batched) and does lookups
  # and the rest: about 2.5 times the pilot's single-insert time per record.
  @run_per_insert 2.5

  defp pilot(mod, opts, kind, n, dir, spec) do
    bin0 = settle_binary()
    s = mod.open(opts, dir)
    spent = fill(kind, @pilot, fn chunk -> timed(fn -> insert_each(chunk, mod, s) end) end, nil)
    per = (mod.memory(s) + binary_growth(bin0)) / @pilot
    mod.destroy(s)
    predicted = per * n
    pilot_s = @run_per_insert * us(spent) / @pilot * n / 1.0e6
    # The parent's prediction, from this store at a smaller count, is better.
    seconds = spec[:predicted_s] || pilot_s
    budget_s = spec[:budget_s]
    available = Sys.mem_available()
    limit = mod.limit(opts)

    cond do
      predicted > @mem_share * available ->
        {:skip, :memory,
         "predicted #{Heft.Bench.Report.gb(predicted)} (#{round(per)} B/record) > 60% of the #{Heft.Bench.Report.gb(available)} of RAM available"}

      limit != nil and predicted > elem(limit, 0) ->
        {:skip, :limit,
         "predicted #{Heft.Bench.Report.gb(predicted)} (#{round(per)} B/record): #{elem(limit, 1)}"}

      budget_s != nil and seconds > budget_s ->
        from =
          if spec[:predicted_s],
            do: "scaled from the previous count",
            else: "pilot: #{Float.round(us(spent) / @pilot, 1)} µs/insert"

        {:skip, :budget,
         "predicted #{round(seconds)} s a run (#{from}) > #{round(budget_s)} s, its share of the time budget"}

      true ->
        :ok
    end
  end

  defp measure(mod, opts, kind, n, dir) do
    bin0 = settle_binary()
    rss0 = Sys.rss()
    io0 = Sys.write_bytes()
    # What the directory holds already (itself; Mnesia's schema).
    disk0 = Sys.disk_bytes(dir)

    s = mod.open(opts, dir)
    insert = fill(kind, n, fn chunk -> timed(fn -> insert_each(chunk, mod, s) end) end, "insert")
    note = if function_exported?(mod, :settle, 2), do: mod.settle(s, opts)
    store_bytes = mod.memory(s) + binary_growth(bin0)
    payload = if function_exported?(mod, :payload, 1), do: mod.payload(s)
    rss = Sys.rss() - rss0

    keys = for _ <- 1..@lookups, do: :rand.uniform(n)
    verify!(mod, s, kind, Enum.take(keys, 100), "after insert")
    progress("lookup", 0, @lookups)
    lookup_each(Enum.take(keys, 1_000), mod, s)
    {lookups, lookup} = lookups(Enum.chunk_every(keys, 1_000), mod, s, 0, 0)

    {load, disk, s} =
      if mod.persistent?(opts) do
        mod.close(s)
        disk = Sys.disk_bytes(dir) - disk0
        progress("load", 0, n)
        t0 = now()
        s = mod.reopen(s, opts, dir)
        load = now() - t0
        verify!(mod, s, kind, Enum.take(keys, 100), "after reopen")
        {load, disk, s}
      else
        {nil, Sys.disk_bytes(dir) - disk0, s}
      end

    written = Sys.write_bytes() - io0
    mod.destroy(s)

    s = mod.open(opts, dir)

    batch =
      fill(kind, n, fn chunk -> timed(fn -> mod.insert_many(s, chunk) end) end, "batch insert")

    mod.destroy(s)

    %{
      status: :ok,
      insert_us: us(insert) / n,
      batch_us: us(batch) / n,
      lookup_us: us(lookup) / lookups,
      bytes: store_bytes / n,
      rss_bytes: rss / n,
      load_ms: load && us(load) / 1000,
      disk_bytes: disk / n,
      written_bytes: written / n,
      payload_ratio: payload_ratio(payload),
      overloads: count_overloads(0),
      accounting: mod.accounting(opts),
      note: note
    }
  end

  defp payload_ratio({raw, stored}) when raw > 0, do: stored / raw
  defp payload_ratio(_), do: nil

  # Generates records 1..n a chunk at a time (not timed) and hands each chunk
  # to `fun`, which returns the native time it spent; returns the sum.
  defp fill(kind, n, fun, label), do: fill(kind, n, fun, label, 1, 0, now())

  defp fill(_kind, n, _fun, _label, first, total, _shown) when first > n, do: total

  defp fill(kind, n, fun, label, first, total, shown) do
    last = min(first + @chunk - 1, n)
    spent = fun.(Kinds.chunk(kind, first, last))

    if label && now() - shown > ms(@progress_every_ms) do
      progress(label, last, n)
      fill(kind, n, fun, label, last + 1, total + spent, now())
    else
      fill(kind, n, fun, label, last + 1, total + spent, shown)
    end
  end

  defp insert_each([], _mod, _s), do: 0

  defp insert_each([rec | rest], mod, s) do
    mod.insert(s, rec)
    insert_each(rest, mod, s)
  end

  # Lookups a thousand keys at a time until all are done or @lookup_ms have
  # passed (slow stores); returns {lookups done, native time}.
  defp lookups([], _mod, _s, done, time), do: {done, time}

  defp lookups([keys | rest], mod, s, done, time) do
    time = time + timed(fn -> lookup_each(keys, mod, s) end)
    done = done + length(keys)
    if us(time) > @lookup_ms * 1000, do: {done, time}, else: lookups(rest, mod, s, done, time)
  end

  defp lookup_each([], _mod, _s), do: :ok

  defp lookup_each([key | rest], mod, s) do
    mod.lookup(s, key)
    lookup_each(rest, mod, s)
  end

  # Each looked-up record must be the one inserted (Mnesia's carry the table
  # name first, so the value is the last element).
  defp verify!(mod, s, kind, keys, phase) do
    for key <- keys do
      case mod.lookup(s, key) do
        [rec] when elem(rec, tuple_size(rec) - 2) == key ->
          value = elem(rec, tuple_size(rec) - 1)

          if Kinds.deterministic?(kind) and value != elem(Kinds.record(kind, key), 1),
            do: raise("#{phase}, lookup(#{key}) returned a different value")

        other ->
          raise "#{phase}, lookup(#{key}) returned #{inspect(other, limit: 5)}"
      end
    end
  end

  # Mnesia overload events, sent to this process by :mnesia.subscribe(:system).
  defp count_overloads(n) do
    receive do
      {:mnesia_system_event, {:mnesia_overload, _}} -> count_overloads(n + 1)
      {:mnesia_system_event, _} -> count_overloads(n)
    after
      0 -> n
    end
  end

  # Garbage-collects this process (dropping the chunks' refc binaries) and
  # returns the bytes of binaries the VM still holds: those that ETS and
  # Mnesia point to are part of the store's cost but not of its accounting.
  defp settle_binary do
    :erlang.garbage_collect()
    :erlang.memory(:binary)
  end

  # The VM's binary memory grown since `bin0`: refc binaries the store
  # points to. Never below 0: binaries freed meanwhile (garbage of other
  # processes, of the VM) are not the store's, and took a small map cell of
  # Heft 17 bytes a record below its own accounting.
  defp binary_growth(bin0), do: max(settle_binary() - bin0, 0)

  defp progress(phase, done, total), do: IO.puts("@@progress #{phase} #{done} #{total}")

  defp timed(fun) do
    t0 = now()
    fun.()
    now() - t0
  end

  defp now, do: :erlang.monotonic_time()
  defp ms(n), do: :erlang.convert_time_unit(n, :millisecond, :native)
  defp us(native), do: :erlang.convert_time_unit(native, :native, :nanosecond) / 1000
end
