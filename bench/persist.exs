# Persistence benchmark: Heft persistent tables against Mnesia disc_copies
# and DETS on the same records, ending with a summary table.
#
#     mix run bench/persist.exs                 # every section
#     mix run bench/persist.exs insert restart  # some of them
#
# Sections:
#   insert   - µs per single-record insert: Heft in each sync mode, Mnesia
#              disc_copies dirty_write, DETS insert.
#   group    - fsyncs per 1,000 concurrent :commit inserts (100 processes
#              x 10 inserts each).
#   restart  - time to reopen 1,000,000 small maps and 200,000 100-tuples,
#              Heft open/1 (three times) against Mnesia's wait_for_tables
#              after a restart.
#   dump     - latency of single inserts while a dump of a
#              1,000,000-record table runs (twice), and without one.
#
# Files go under $HEFT_BENCH_DIR (default: System.tmp_dir!/heft-bench).
# Figures are wall-clock on whatever machine runs this: compare systems on
# one machine, in one run, not across machines; the load average is
# printed with the summary.

defmodule PersistBench do
  @root System.get_env("HEFT_BENCH_DIR") || Path.join(System.tmp_dir!(), "heft-bench")

  def small(i), do: {i, %{id: i, name: "user-#{i}", age: rem(i, 90)}}
  def big(i), do: {i, :erlang.make_tuple(100, List.duplicate(:a, 10))}

  def dir(name) do
    d = Path.join(@root, name)
    File.rm_rf!(d)
    d
  end

  defp us_per_op(n, fun) do
    {us, _} = :timer.tc(fn -> Enum.each(1..n, fun) end)
    us / n
  end

  def fmt(x) when is_number(x), do: :erlang.float_to_binary(x / 1, decimals: 1)

  # Results for the summary, in the order they were measured.
  defp put_result(key, value), do: Process.put({:result, key}, value)
  def result(key), do: Process.get({:result, key})

  # ---- insert ----------------------------------------------------------

  @insert_rows [
    {:none, "Heft sync: :none"},
    {:interval, "Heft sync: {:interval, 100}"},
    {:commit, "Heft sync: :commit"},
    {:mnesia, "Mnesia disc_copies dirty_write"},
    {:dets, "DETS insert"}
  ]
  def insert_rows, do: @insert_rows

  def insert do
    IO.puts("\n== insert: µs per single-record insert (small map / 100-tuple) ==")

    runs = %{
      none: fn rec, n -> heft_insert(rec, n, :none) end,
      interval: fn rec, n -> heft_insert(rec, n, {:interval, 100}) end,
      commit: fn rec, n -> heft_insert(rec, div(n, 20), :commit) end,
      mnesia: fn rec, n -> mnesia_insert(rec, n) end,
      dets: fn rec, n -> dets_insert(rec, n) end
    }

    for {key, label} <- @insert_rows do
      s = runs[key].(&small/1, 40_000)
      b = runs[key].(&big/1, 10_000)
      put_result({:insert, key}, {s, b})
      IO.puts(String.pad_trailing(label, 34) <> "#{fmt(s)} µs   #{fmt(b)} µs")
    end
  end

  defp heft_insert(rec, n, sync) do
    d = dir("insert-heft")
    t = Heft.new(:bench_insert, persist: d, sync: sync)
    r = us_per_op(n, &Heft.insert(t, rec.(&1)))
    Heft.delete(t)
    r
  end

  defp mnesia_insert(rec, n) do
    start_mnesia(dir("insert-mnesia"))
    {:atomic, :ok} = :mnesia.create_table(:bench, disc_copies: [node()], attributes: [:k, :v])

    r =
      us_per_op(n, fn i ->
        {k, v} = rec.(i)
        :mnesia.dirty_write({:bench, k, v})
      end)

    stop_mnesia()
    r
  end

  defp dets_insert(rec, n) do
    d = dir("insert-dets")
    File.mkdir_p!(d)
    {:ok, t} = :dets.open_file(:bench_dets, file: String.to_charlist(Path.join(d, "t.dets")))
    r = us_per_op(n, &:dets.insert(t, rec.(&1)))
    :dets.close(t)
    r
  end

  defp start_mnesia(d) do
    File.mkdir_p!(d)
    Application.put_env(:mnesia, :dir, String.to_charlist(d))
    :ok = :mnesia.create_schema([node()])
    :ok = :mnesia.start()
  end

  defp stop_mnesia do
    :stopped = :mnesia.stop()
  end

  # ---- group commit ----------------------------------------------------

  def group do
    IO.puts("\n== group commit: 100 processes x 10 :commit inserts ==")
    t = Heft.new(:bench_group, [:public, persist: dir("group"), sync: :commit])
    parent = self()

    {us, _} =
      :timer.tc(fn ->
        for p <- 1..100 do
          spawn(fn ->
            for i <- 1..10, do: true = Heft.insert(t, small(p * 100 + i))
            send(parent, :done)
          end)
        end

        for _ <- 1..100, do: receive(do: (:done -> :ok))
      end)

    info = Heft.info(t)
    put_result(:group, {info[:log_fsyncs], us / 1000})
    IO.puts("commits #{info[:commits]}, fsyncs #{info[:log_fsyncs]}, #{fmt(us / 1000)} ms")
    Heft.delete(t)
  end

  # ---- restart ---------------------------------------------------------

  def restart do
    IO.puts("\n== restart: time to reopen ==")
    restart_case(:small, "1,000,000 small maps", 1_000_000, &small/1)
    restart_case(:big, "200,000 100-tuples", 200_000, &big/1)
  end

  defp restart_case(key, label, n, rec) do
    d = dir("restart-heft")
    t = Heft.new(:bench_restart, persist: d, dump_log_write_threshold: 10_000_000)

    for c <- Enum.chunk_every(1..n, 1000), do: true = Heft.insert(t, Enum.map(c, rec))
    :ok = Heft.close(t)
    {heft_log_us, {:ok, t}} = :timer.tc(fn -> Heft.open(d) end)
    :ok = Heft.dump(t)
    :ok = Heft.close(t)

    heft_snap_us =
      for _ <- 1..3 do
        {us, {:ok, t}} = :timer.tc(fn -> Heft.open(d) end)
        ^n = Heft.info(t, :size)
        :ok = Heft.close(t)
        us
      end

    File.rm_rf!(d)
    start_mnesia(dir("restart-mnesia"))
    {:atomic, :ok} = :mnesia.create_table(:bench, disc_copies: [node()], attributes: [:k, :v])

    for c <- Enum.chunk_every(1..n, 1000) do
      {:atomic, _} =
        :mnesia.transaction(fn ->
          for i <- c, do: (fn {k, v} -> :mnesia.write({:bench, k, v}) end).(rec.(i))
        end)
    end

    # Fold Mnesia's log into its table files, as a long-running node would.
    :dumped = :mnesia.dump_log()
    stop_mnesia()

    {mnesia_us, :ok} =
      :timer.tc(fn ->
        :ok = :mnesia.start()
        :ok = :mnesia.wait_for_tables([:bench], :infinity)
      end)

    ^n = :mnesia.table_info(:bench, :size)
    stop_mnesia()

    ms = Enum.map(heft_snap_us, &(&1 / 1000))
    put_result({:restart, key}, {heft_log_us / 1000, ms, mnesia_us / 1000})

    IO.puts(
      "#{String.pad_trailing(label, 22)} Heft (log) #{fmt(heft_log_us / 1000)} ms, " <>
        "Heft (snapshot) #{Enum.map_join(ms, " / ", &fmt/1)} ms, " <>
        "Mnesia #{fmt(mnesia_us / 1000)} ms (#{fmt(mnesia_us / 1000 / Enum.max(ms))}x)"
    )
  end

  # ---- insert latency during a dump -----------------------------------

  def dump do
    IO.puts("\n== insert latency while a dump of 1,000,000 records runs ==")
    d = dir("dump")
    t = Heft.new(:bench_dump, [:public, persist: d, dump_log_write_threshold: 100_000_000])

    for c <- Enum.chunk_every(1..1_000_000, 1000),
        do: true = Heft.insert(t, Enum.map(c, &small/1))

    # The same inserts without a dump, for comparison on this machine.
    idle =
      for i <- 3_000_000..3_019_999 do
        {us, true} = :timer.tc(fn -> Heft.insert(t, small(i)) end)
        us
      end

    IO.puts("without a dump: #{percentiles(idle)}")

    during =
      for {round, first} <- [{1, 4_000_000}, {2, 5_000_000}] do
        task = Task.async(fn -> :timer.tc(fn -> Heft.dump(t) end) end)
        lat = measure_until(t, task, first, [])
        {dump_us, :ok} = Task.await(task, :infinity)

        IO.puts(
          "during dump #{round} (#{fmt(dump_us / 1000)} ms, #{length(lat)} inserts): " <>
            percentiles(lat)
        )

        lat
      end

    put_result(:dump, {pct(idle, 0.99), Enum.map(during, &{pct(&1, 0.99), pct(&1, 0.999)})})
    Heft.delete(t)
  end

  defp pct(lat, q) do
    sorted = Enum.sort(lat)
    Enum.at(sorted, min(length(sorted) - 1, trunc(q * length(sorted))))
  end

  defp percentiles(lat) do
    "p50 #{pct(lat, 0.5)} µs, p99 #{pct(lat, 0.99)} µs, p99.9 #{pct(lat, 0.999)} µs, " <>
      "max #{Enum.max(lat)} µs"
  end

  defp measure_until(t, task, i, acc) do
    if Process.info(self(), :messages)
       |> elem(1)
       |> Enum.any?(&match?({ref, _} when ref == task.ref, &1)) do
      acc
    else
      {us, true} = :timer.tc(fn -> Heft.insert(t, small(i)) end)
      measure_until(t, task, i + 1, [us | acc])
    end
  end

  # ---- summary ---------------------------------------------------------

  def load, do: File.read!("/proc/loadavg") |> String.split() |> Enum.take(3) |> Enum.join(" ")

  def summary(load_before) do
    rows =
      for({key, label} <- @insert_rows, r = result({:insert, key}), do: insert_row(label, r)) ++
        group_rows(result(:group)) ++
        restart_rows(result({:restart, :small}), "1,000,000 small maps") ++
        restart_rows(result({:restart, :big}), "200,000 100-tuples") ++
        dump_rows(result(:dump))

    IO.puts(
      "\n== summary (#{System.schedulers_online()} schedulers; load average " <>
        "#{load_before} before, #{load()} after) ==\n"
    )

    width = rows |> Enum.map(&String.length(elem(&1, 0))) |> Enum.max(fn -> 10 end)
    IO.puts("| " <> String.pad_trailing("measure", width) <> " | figure")
    IO.puts("|-" <> String.duplicate("-", width) <> "-|-------")
    for {k, v} <- rows, do: IO.puts("| " <> String.pad_trailing(k, width) <> " | " <> v)
  end

  defp insert_row(label, {s, b}),
    do: {"insert µs/op, #{label}", "#{fmt(s)} (small map), #{fmt(b)} (100-tuple)"}

  defp group_rows(nil), do: []

  defp group_rows({fsyncs, ms}),
    do: [{"fsyncs per 1,000 :commit inserts (100 processes)", "#{fsyncs} (#{fmt(ms)} ms)"}]

  defp restart_rows(nil, _), do: []

  defp restart_rows({log_ms, snap_ms, mnesia_ms}, label) do
    [
      {"reopen ms, #{label}: Heft (snapshot, 3 runs)",
       Enum.map_join(snap_ms, " / ", &fmt/1) <>
         " (Mnesia #{fmt(mnesia_ms)}: #{fmt(mnesia_ms / Enum.max(snap_ms))}x or more)"},
      {"reopen ms, #{label}: Heft (log only)", fmt(log_ms)}
    ]
  end

  defp dump_rows(nil), do: []

  defp dump_rows({idle_p99, during}) do
    [
      {"insert p99 µs without a dump", "#{idle_p99}"},
      {"insert p99 / p99.9 µs during a dump of 1M records",
       Enum.map_join(during, ", ", fn {p99, p999} -> "#{p99} / #{p999}" end)}
    ]
  end
end

# Mnesia warns on every dump_log overload while the bench floods it.
Logger.configure(level: :error)

sections =
  case System.argv() do
    [] -> ~w(insert group restart dump)
    args -> args
  end

before = PersistBench.load()
for s <- sections, do: apply(PersistBench, String.to_atom(s), [])
PersistBench.summary(before)
