# Persistence benchmark: Heft persistent tables against Mnesia disc_copies
# and DETS on the same records.
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
#              Heft open/1 against Mnesia's wait_for_tables after a restart.
#   dump     - p99 latency of single inserts while a dump of a
#              1,000,000-record table runs.
#
# Files go under $HEFT_BENCH_DIR (default: System.tmp_dir!/heft-bench).
# Figures are wall-clock on whatever machine runs this: compare systems on
# one machine, not across machines.

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

  defp fmt(x), do: :erlang.float_to_binary(x / 1, decimals: 1)

  # ---- insert ----------------------------------------------------------

  def insert do
    IO.puts("\n== insert: µs per single-record insert (small map / 100-tuple) ==")

    rows = [
      {"Heft sync: :none", fn rec, n -> heft_insert(rec, n, :none) end},
      {"Heft sync: {:interval, 100}", fn rec, n -> heft_insert(rec, n, {:interval, 100}) end},
      {"Heft sync: :commit", fn rec, n -> heft_insert(rec, div(n, 20), :commit) end},
      {"Mnesia disc_copies dirty_write", fn rec, n -> mnesia_insert(rec, n) end},
      {"DETS insert", fn rec, n -> dets_insert(rec, n) end}
    ]

    for {label, run} <- rows do
      s = run.(&small/1, 40_000)
      b = run.(&big/1, 10_000)
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
    IO.puts("commits #{info[:commits]}, fsyncs #{info[:log_fsyncs]}, #{fmt(us / 1000)} ms")
    Heft.delete(t)
  end

  # ---- restart ---------------------------------------------------------

  def restart do
    IO.puts("\n== restart: time to reopen ==")
    restart_case("1,000,000 small maps", 1_000_000, &small/1)
    restart_case("200,000 100-tuples", 200_000, &big/1)
  end

  defp restart_case(label, n, rec) do
    d = dir("restart-heft")
    t = Heft.new(:bench_restart, persist: d, dump_log_write_threshold: 10_000_000)

    for c <- Enum.chunk_every(1..n, 1000), do: true = Heft.insert(t, Enum.map(c, rec))
    :ok = Heft.close(t)
    {heft_log_us, {:ok, t}} = :timer.tc(fn -> Heft.open(d) end)
    :ok = Heft.dump(t)
    :ok = Heft.close(t)
    {heft_snap_us, {:ok, t}} = :timer.tc(fn -> Heft.open(d) end)
    ^n = Heft.info(t, :size)
    Heft.delete(t)

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

    IO.puts(
      "#{String.pad_trailing(label, 22)} Heft (log) #{fmt(heft_log_us / 1000)} ms, " <>
        "Heft (snapshot) #{fmt(heft_snap_us / 1000)} ms, Mnesia #{fmt(mnesia_us / 1000)} ms " <>
        "(#{fmt(mnesia_us / heft_snap_us)}x)"
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
      for i <- 3_000_000..3_001_999 do
        {us, true} = :timer.tc(fn -> Heft.insert(t, small(i)) end)
        us
      end

    task = Task.async(fn -> :timer.tc(fn -> Heft.dump(t) end) end)
    lat = measure_until(t, task, 2_000_000, [])
    {dump_us, :ok} = Task.await(task, :infinity)

    IO.puts(
      "without a dump: #{percentiles(idle)}\n" <>
        "during a dump (#{fmt(dump_us / 1000)} ms, #{length(lat)} inserts): #{percentiles(lat)}"
    )

    Heft.delete(t)
  end

  defp percentiles(lat) do
    sorted = Enum.sort(lat)
    p = fn q -> Enum.at(sorted, min(length(sorted) - 1, trunc(q * length(sorted)))) end
    "p50 #{p.(0.5)} µs, p99 #{p.(0.99)} µs, max #{List.last(sorted)} µs"
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
end

sections =
  case System.argv() do
    [] -> ~w(insert group restart dump)
    args -> args
  end

for s <- sections, do: apply(PersistBench, String.to_atom(s), [])
