# Ulf Wiger's experiment through Mnesia: records
# {t, i, make_tuple(100, duplicate(10, a))} in a `heft_copies` table against
# `disc_copies` (ETS + disk_log) and `disc_only_copies` (DETS).
#
#     mix run bench/mnesia.exs                       # 900,000 heft_copies records
#     mix run bench/mnesia.exs --count 100000 --disc-count 50000 --dets-count 20000
#
# Options: --count N (heft_copies records, 900,000), --disc-count N
# (disc_copies; default: the largest count whose ETS table fits in half of
# the host's available memory, at most --count and --max-disc),
# --max-disc N (500,000: keeps the run within ~15 min), --dets-count N
# (disc_only_copies; default min(100,000, disc count): DETS files stop at
# 2 GB and a write costs ~250 µs), --reps N (latency repetitions, 5),
# --load-reps N (load repetitions, 3), --ops N (operations per latency
# sample, 2,000), --out FILE (also write the report there).
#
# Every store lives in a child VM of its own (`:peer`, own Mnesia
# directory under $HEFT_BENCH_DIR or the temp dir). Latency samples are
# interleaved: repetition r takes each kind of operation in turn and, for
# each, the stores in turn, the order rotated each time. A sample runs in
# a fresh process that matches each result and drops it (an earlier
# version collected the 2,000 results of a sample, 34 MB of flattened
# records for the reads, so the sample timed the collections of an ever
# larger heap), after Mnesia's log was dumped (so that a disc_copies
# dump left over from the last write sample does not land in the next
# sample, of whichever store). The load at Mnesia start is timed in a fresh child VM each
# time (mnesia:start/0 + wait_for_tables/2), the stores again in turn; the
# files stay in the OS page cache between runs (not dropped: the machine is
# shared), so the load figures are for warm files.

Code.require_file("harness.exs", __DIR__)

{:module, _, child_bin, _} =
  defmodule MnesiaBench.Child do
    # Runs inside each child VM (its object code is loaded there).
    @backends [heft_copies: :heft_mnesia, heft_ram_copies: :heft_mnesia]

    # make_tuple/2 shares one list 100 times; Heft keeps a term's sharing
    # (a lookup then builds 125 words), ETS, DETS and Mnesia's transaction
    # store do not (2,105 words). Records from a socket or a file are not
    # shared: the benchmark writes the unshared copy everywhere.
    @value :erlang.make_tuple(100, List.duplicate(:a, 10))
           |> :erlang.term_to_binary()
           |> :erlang.binary_to_term()
    def record(i), do: {:t, i, @value}

    def rss do
      "/proc/self/status"
      |> File.read!()
      |> String.split("\n")
      |> Enum.find_value(fn l ->
        case String.split(l) do
          ["VmRSS:", kb, "kB"] -> String.to_integer(kb) * 1024
          _ -> nil
        end
      end)
    end

    def set_dir(dir) do
      case :application.load(:mnesia) do
        :ok -> :ok
        {:error, {:already_loaded, :mnesia}} -> :ok
      end

      :ok = :application.set_env(:mnesia, :dir, String.to_charlist(dir))
      :ok = :application.set_env(:mnesia, :core_dir, String.to_charlist(dir))
    end

    def create(dir, store) do
      File.rm_rf!(dir)
      File.mkdir_p!(dir)
      set_dir(dir)
      :ok = :mnesia.create_schema([node()], backend_types: @backends)
      :ok = :mnesia.start()
      :erlang.garbage_collect()
      rss0 = rss()
      {:atomic, :ok} = :mnesia.create_table(:t, [{store, [node()]}, {:attributes, [:k, :v]}])
      rss0
    end

    # Fills 1..n with dirty writes: µs until the last one returned, and
    # µs more until Mnesia's transaction log had written them all. Every
    # write also goes to Mnesia's LATEST.LOG through a disk_log process
    # (for heft_copies too: Mnesia logs external copies' commits), and a
    # store whose writes return faster than that process writes leaves it
    # a backlog: 900,000 heft_copies writes left ~1.7 GB of queued
    # commit records, which for seconds after the fill held memory and
    # took CPU from whatever ran next.
    def fill(n) do
      {us, :ok} = :timer.tc(fn -> Enum.each(1..n, &:mnesia.dirty_write(record(&1))) end)
      {drain_us, :ok} = :timer.tc(fn -> drain_log() end)
      {us, drain_us}
    end

    # Returns once Mnesia's log process has handled every commit sent to it
    # (disk_log serves requests in order) and the log was dumped.
    defp drain_log do
      :ok = :disk_log.sync(:latest_log)
      :dumped = :mnesia.dump_log()
      :ok
    end

    def memory(store, rss0) do
      words = :mnesia.table_info(:t, :memory)
      ws = :erlang.system_info(:wordsize)

      table_bytes =
        case store do
          # Mnesia answers dets:info(T, memory) for disc_only_copies: the
          # file's size in bytes.
          :disc_only_copies -> words
          _ -> words * ws
        end

      heft =
        if store == :heft_copies,
          do: Heft.info(:heft_mnesia_admin.handle(:heft_copies, :t), :memory)

      %{
        size: :mnesia.table_info(:t, :size),
        rss_delta: rss() - rss0,
        table_bytes: table_bytes,
        heft_bytes: heft
      }
    end

    # One latency sample: `ops` operations of one kind on random keys of
    # 1..n, in a process spawned for the sample (so no sample inherits
    # another's heap), each result matched and dropped at once (nothing
    # accumulates: the heap holds one result at a time, as a caller's
    # would). Mnesia's log (and Heft's dump, if one runs) is settled
    # first, so that no work left over from an earlier sample (a
    # disc_copies log dump, in this VM or while another store's VM is
    # measured) lands in this one; what the operations themselves set off
    # during the sample (Mnesia dumps its log every 1,000 writes) counts.
    # Answers the mean µs per operation (wall time over `ops`) and the
    # median of the operations' own times.
    def sample(kind, n, ops, seed) do
      settle()
      :rand.seed(:exsss, {seed, 7, 11})
      keys = for _ <- 1..ops, do: :rand.uniform(n)
      op = op(kind)
      parent = self()

      {pid, ref} =
        spawn_monitor(fn ->
          t0 = :erlang.monotonic_time()
          times = timed(keys, op, [])
          total = :erlang.monotonic_time() - t0
          send(parent, {self(), total, times})
        end)

      receive do
        {^pid, total, times} ->
          receive do: ({:DOWN, ^ref, _, _, _} -> :ok)
          us = fn t -> :erlang.convert_time_unit(t, :native, :nanosecond) / 1000 end
          sorted = Enum.sort(times)
          %{mean: us.(total) / ops, p50: us.(Enum.at(sorted, div(ops, 2)))}

        {:DOWN, ^ref, _, _, reason} ->
          exit({:sample_failed, kind, reason})
      end
    end

    defp op(:dirty_write), do: fn k -> :ok = :mnesia.dirty_write(record(k)) end

    defp op(:tx_write),
      do: fn k -> {:atomic, :ok} = :mnesia.transaction(fn -> :mnesia.write(record(k)) end) end

    defp op(:dirty_read), do: fn k -> [_] = :mnesia.dirty_read(:t, k) end

    defp op(:tx_read),
      do: fn k -> {:atomic, [_]} = :mnesia.transaction(fn -> :mnesia.read(:t, k) end) end

    defp timed([], _op, acc), do: acc

    defp timed([k | ks], op, acc) do
      t = :erlang.monotonic_time()
      op.(k)
      timed(ks, op, [:erlang.monotonic_time() - t | acc])
    end

    # Mnesia's log written and dumped (a disc_copies table's pending writes
    # go to its .DCL file), a Heft dump in progress finished, garbage
    # collected.
    defp settle do
      drain_log()

      case :heft_mnesia_admin.handle(:heft_copies, :t) do
        :undefined -> :ok
        h -> wait_dump(h)
      end

      for p <- Process.list(), do: :erlang.garbage_collect(p)
      :ok
    end

    defp wait_dump(h) do
      if Heft.info(h, :dumping) do
        Process.sleep(10)
        wait_dump(h)
      else
        :ok
      end
    end

    # A fresh VM: Mnesia started on `dir`, then waits for :t. µs and RSS growth.
    def load(dir) do
      set_dir(dir)
      :erlang.garbage_collect()
      rss0 = rss()
      t0 = System.monotonic_time(:microsecond)
      :ok = :mnesia.start()
      :ok = :mnesia.wait_for_tables([:t], :infinity)
      us = System.monotonic_time(:microsecond) - t0
      %{us: us, rss_delta: rss() - rss0, size: :mnesia.table_info(:t, :size)}
    end

    # DETS closes a table whose owner has gone in its own time: wait until
    # every file is closed, or the node's halt that follows cuts one (OTP
    # 27's peer:stop halts at once), and the next load repairs it with its
    # last writes lost.
    def stop do
      result = :mnesia.stop()
      dets_closed(500)
      result
    end

    defp dets_closed(0), do: :ok

    defp dets_closed(tries) do
      if :dets.all() != [] do
        Process.sleep(10)
        dets_closed(tries - 1)
      end
    end
  end

:persistent_term.put(:mnesia_bench_child, child_bin)

defmodule MnesiaBench do
  @stores [:heft_copies, :disc_copies, :disc_only_copies]
  @kinds [:dirty_write, :tx_write, :dirty_read, :tx_read]
  @timeout 3_600_000

  def main(argv) do
    {opts, _, _} =
      OptionParser.parse(argv,
        strict: [
          count: :integer,
          disc_count: :integer,
          max_disc: :integer,
          dets_count: :integer,
          reps: :integer,
          load_reps: :integer,
          ops: :integer,
          out: :string
        ]
      )

    t_start = System.monotonic_time(:millisecond)
    root = System.get_env("HEFT_BENCH_DIR") || Path.join(System.tmp_dir!(), "heft-bench-mnesia")
    n_heft = opts[:count] || 900_000
    host = Heft.Memory.host()
    ws = :erlang.system_info(:wordsize)
    # An ETS copy of one record: its words plus ETS's per-object overhead
    # (measured: 16,871 bytes a record at 100,000), and a quarter more for
    # the load's transient terms.
    per_rec = round((:erts_debug.flat_size(MnesiaBench.Child.record(1)) + 8) * ws * 1.25)
    fit = div(div(host.mem_available, 2), per_rec)
    max_disc = opts[:max_disc] || 500_000
    n_disc = opts[:disc_count] || Enum.min([fit, n_heft, max_disc])
    n_dets = opts[:dets_count] || min(100_000, n_disc)
    reps = opts[:reps] || 5
    load_reps = opts[:load_reps] || 3
    ops = opts[:ops] || 2_000
    counts = %{heft_copies: n_heft, disc_copies: n_disc, disc_only_copies: n_dets}

    header = [
      "# Mnesia backend benchmark (bench/mnesia.exs)",
      "",
      "date: #{DateTime.utc_now() |> DateTime.truncate(:second)}, " <>
        "#{System.schedulers_online()} schedulers, OTP #{System.otp_release()}, " <>
        "host RAM #{gb(host.mem_total)}, available at start #{gb(host.mem_available)}",
      "load average at start: #{loadavg()} (a machine shared with other jobs)",
      "records: {t, i, make_tuple(100, duplicate(10, a))}; heft_copies #{n(n_heft)}, " <>
        "disc_copies #{n(n_disc)}, disc_only_copies #{n(n_dets)}",
      "disc_copies: ~#{n(per_rec)} B a record while loading; half the available memory " <>
        "holds #{n(fit)}#{if opts[:disc_count], do: " (count given: #{n(n_disc)})", else: "; used #{n(n_disc)} (at most --count and --max-disc #{n(max_disc)})"}",
      if(n_dets < n_heft,
        do: "disc_only_copies: #{n(n_dets)} (DETS files stop at 2 GB; a write costs ~250 µs)",
        else: ""
      )
    ]

    Enum.each(header, &IO.puts/1)

    # Build: one VM per store, all alive during the latency samples.
    built =
      for store <- @stores, into: %{} do
        dir = Path.join(root, Atom.to_string(store))
        vm = child()
        rss0 = call(vm, :create, [dir, store])
        {fill_us, drain_us} = call(vm, :fill, [counts[store]])
        mem = call(vm, :memory, [store, rss0])
        true = mem.size == counts[store]

        IO.puts(
          "built #{store}: #{n(counts[store])} records in #{Float.round(fill_us / 1.0e6, 1)} s " <>
            "(#{f(fill_us / counts[store])} µs a dirty_write; Mnesia's log written " <>
            "#{Float.round(drain_us / 1.0e6, 1)} s later), RSS +#{n(mem.rss_delta)} B"
        )

        {store, %{vm: vm, dir: dir, fill_us: fill_us, drain_us: drain_us, mem: mem}}
      end

    # Interleaved: repetition r takes each kind of operation in turn, and
    # for each the stores in turn, the order rotated each time.
    lat =
      for r <- 1..reps,
          {kind, i} <- Enum.with_index(@kinds),
          store <- rotate(@stores, r + i),
          reduce: %{} do
        acc ->
          l = call(built[store].vm, :sample, [kind, counts[store], ops, r])
          load1 = loadavg() |> String.split() |> hd() |> String.to_float()

          acc
          |> Map.update({store, kind}, [l], &[l | &1])
          |> Map.update(:load1, [load1], &[load1 | &1])
      end

    IO.puts(
      "latency samples done (#{reps} x #{n(ops)} ops of each kind per store; " <>
        "1-min load average #{f(Enum.min(lat.load1))}–#{f(Enum.max(lat.load1))})"
    )

    for store <- @stores, do: :stopped = call(built[store].vm, :stop, [])
    for store <- @stores, do: :peer.stop(built[store].vm)

    loads =
      for r <- 1..load_reps, store <- rotate(@stores, r), reduce: %{} do
        acc ->
          vm = child()
          l = call(vm, :load, [built[store].dir])
          true = l.size == counts[store]
          :stopped = call(vm, :stop, [])
          :peer.stop(vm)
          IO.puts("load #{r} #{store}: #{f(l.us / 1000)} ms")
          Map.update(acc, store, [l], &[l | &1])
      end

    report =
      header ++
        report(counts, built, lat, loads, ops, reps, load_reps) ++
        [
          "",
          "load average at end: #{loadavg()}; wall time " <>
            "#{div(System.monotonic_time(:millisecond) - t_start, 1000)} s"
        ]

    IO.puts("")
    Enum.each(report, &IO.puts/1)
    if opts[:out], do: File.write!(opts[:out], Enum.join(report, "\n") <> "\n")
    File.rm_rf!(root)
  end

  defp report(counts, built, lat, loads, ops, reps, load_reps) do
    per = fn store, bytes -> bytes / counts[store] end
    load_med = fn store, key -> median(Enum.map(loads[store], & &1[key])) end

    mem_rows =
      for store <- @stores do
        m = built[store].mem

        "| #{store} | #{n(counts[store])} | #{f(per.(store, load_med.(store, :rss_delta)))} | " <>
          "#{f(per.(store, m.rss_delta))} | #{f(per.(store, m.table_bytes))}" <>
          "#{if store == :disc_only_copies, do: " (file)", else: ""} | " <>
          "#{if m.heft_bytes, do: f(per.(store, m.heft_bytes)), else: "-"} |"
      end

    op_labels = [
      dirty_write: "mnesia:dirty_write",
      tx_write: "transaction(write)",
      dirty_read: "mnesia:dirty_read",
      tx_read: "transaction(read)"
    ]

    op_rows = fn stat ->
      for {key, label} <- op_labels do
        cells = for s <- @stores, do: ms(Enum.map(lat[{s, key}], & &1[stat]))
        "| #{label} | " <> Enum.join(cells, " | ") <> " |"
      end
    end

    load_rows =
      for store <- @stores do
        us = Enum.map(loads[store], & &1.us)

        "| #{store} | #{n(counts[store])} | #{ms(Enum.map(us, &(&1 / 1000)))} | " <>
          "#{f(median(us) / counts[store])} |"
      end

    # Goals, per record, heft_copies against disc_copies.
    mem_h = per.(:heft_copies, load_med.(:heft_copies, :rss_delta))
    mem_d = per.(:disc_copies, load_med.(:disc_copies, :rss_delta))
    tab_h = per.(:heft_copies, built.heft_copies.mem.table_bytes)
    tab_d = per.(:disc_copies, built.disc_copies.mem.table_bytes)
    load_h = median(Enum.map(loads.heft_copies, & &1.us)) / counts.heft_copies
    load_d = median(Enum.map(loads.disc_copies, & &1.us)) / counts.disc_copies
    op = fn s, k -> median(Enum.map(lat[{s, k}], & &1.mean)) end

    goals =
      [
        goal(
          "memory per record (RSS growth at load) ≤ 1/100 of disc_copies",
          mem_h / mem_d,
          0.01,
          "#{f(mem_h)} B vs #{f(mem_d)} B"
        ),
        goal(
          "memory per record (table_info memory) ≤ 1/100 of disc_copies",
          tab_h / tab_d,
          0.01,
          "#{f(tab_h)} B vs #{f(tab_d)} B"
        ),
        goal(
          "load time per record ≥ 10x faster (ratio ≤ 0.1)",
          load_h / load_d,
          0.1,
          "#{f(load_h)} µs vs #{f(load_d)} µs"
        )
      ] ++
        for {k, label} <- [
              dirty_write: "dirty_write",
              tx_write: "transaction write",
              dirty_read: "dirty_read",
              tx_read: "transaction read"
            ] do
          goal(
            "#{label} no slower (ratio ≤ 1)",
            op.(:heft_copies, k) / op.(:disc_copies, k),
            1.0,
            "#{f(op.(:heft_copies, k))} µs vs #{f(op.(:disc_copies, k))} µs"
          )
        end

    [
      "",
      "## Memory per record, bytes",
      "",
      "RSS growth of a fresh VM while Mnesia loads the table (median of #{load_reps}); RSS growth " <>
        "while it was written; mnesia:table_info(t, memory) (words x #{:erlang.system_info(:wordsize)}; " <>
        "for disc_only_copies Mnesia answers the DETS file's size in bytes); Heft.info(memory).",
      "",
      "| store | records | RSS at load | RSS when written | table_info memory | Heft.info memory |",
      "| --- | --- | --- | --- | --- | --- |"
    ] ++
      mem_rows ++
      [
        "",
        "## µs per operation: mean of a sample (median of #{reps} samples of #{n(ops)} ops on random keys; min–max)",
        "",
        "Each sample runs in a process of its own that drops each result at once, after " <>
          "Mnesia's log was dumped; the kinds of operation and the stores take turns. " <>
          "1-min load average during the samples: #{f(Enum.min(lat.load1))}–#{f(Enum.max(lat.load1))}.",
        "",
        "| operation | heft_copies | disc_copies | disc_only_copies |",
        "| --- | --- | --- | --- |"
      ] ++
      op_rows.(:mean) ++
      [
        "",
        "## µs per operation: median operation of a sample (median of #{reps} samples; min–max)",
        "",
        "| operation | heft_copies | disc_copies | disc_only_copies |",
        "| --- | --- | --- | --- |"
      ] ++
      op_rows.(:p50) ++
      [
        "",
        "Filling by dirty_write, µs a record until the writes returned (and until Mnesia's " <>
          "LATEST.LOG had written them, which every store's writes go through): " <>
          Enum.map_join(
            @stores,
            ", ",
            &"#{&1} #{f(built[&1].fill_us / counts[&1])} (#{f((built[&1].fill_us + built[&1].drain_us) / counts[&1])})"
          ),
        "",
        "## Load at Mnesia start (fresh VM: mnesia:start + wait_for_tables; median of #{load_reps}, min–max)",
        "",
        "| store | records | ms | µs per record |",
        "| --- | --- | --- | --- |"
      ] ++
      load_rows ++
      [
        "",
        "## Goals (heft_copies against disc_copies, per record)",
        "",
        "| goal | ratio | figures | result |",
        "| --- | --- | --- | --- |"
      ] ++ goals
  end

  defp goal(label, ratio, target, figures) do
    res = if ratio <= target, do: "met", else: "**MISSED**"
    "| #{label} | #{Float.round(ratio / 1, 4)} | #{figures} | #{res} |"
  end

  defp rotate(list, r),
    do: Enum.drop(list, rem(r, length(list))) ++ Enum.take(list, rem(r, length(list)))

  # Child VMs do not busy-wait when idle (+sbwt none, for the dirty
  # schedulers too): three VMs share 2 cores, and the idle ones' spinning
  # schedulers would take CPU from the one being measured.
  @no_spin [~c"+sbwt", ~c"none", ~c"+sbwtdcpu", ~c"none", ~c"+sbwtdio", ~c"none"]

  defp child do
    args = @no_spin ++ Enum.flat_map(:code.get_path(), &[~c"-pa", &1])
    {:ok, vm, _} = :peer.start(%{connection: :standard_io, args: args})
    {:ok, _} = :peer.call(vm, :application, :ensure_all_started, [:elixir])
    # Mnesia's "overloaded" warnings (disc_copies dumps its log every
    # 1,000 writes) would bury the output.
    :ok = :peer.call(vm, :logger, :set_primary_config, [:level, :error])
    {mod, bin, file} = :code.get_object_code(MnesiaBench.Child) |> object_code()
    {:module, ^mod} = :peer.call(vm, :code, :load_binary, [mod, file, bin])
    vm
  end

  defp object_code(:error),
    do: {MnesiaBench.Child, :persistent_term.get(:mnesia_bench_child), ~c"mnesia.exs"}

  defp object_code(other), do: other

  defp call(vm, f, a), do: :peer.call(vm, MnesiaBench.Child, f, a, @timeout)

  defp median(xs), do: xs |> Enum.sort() |> Enum.at(div(length(xs), 2))

  defp ms(xs) do
    s = Enum.sort(xs)
    "#{f(median(s))} (#{f(hd(s))}–#{f(List.last(s))})"
  end

  defp loadavg,
    do: File.read!("/proc/loadavg") |> String.split() |> Enum.take(3) |> Enum.join(" ")

  defp gb(b), do: "#{Float.round(b / 1_073_741_824, 1)} GiB"

  defp f(x) when x >= 100, do: n(round(x))
  defp f(x) when x >= 10, do: :erlang.float_to_binary(x / 1, decimals: 1)
  defp f(x), do: :erlang.float_to_binary(x / 1, decimals: 2)

  defp n(i) when is_integer(i), do: Heft.Bench.Report.int(i)
end

MnesiaBench.main(System.argv())
