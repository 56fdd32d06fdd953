defmodule Heft.Bench do
  # `mix bench` (issue 5): runs the matrix record kind × record count × store,
  # each cell in fresh OS processes (Heft.Bench.Cell), prints a Markdown
  # table as it goes, and writes results.csv, results.md and SVG plots into
  # the output directory. Every figure comes from the run; nothing is
  # hard-coded but the goals' targets.
  #
  # Order: count by count (ascending); within a count, every kind and store.
  # Counts up to 100,000 run `runs` times (median, min–max); larger counts
  # run once. A cell is skipped, with the reason, when its store's API is
  # missing; when it is predicted (from the previous count, else from the
  # child's pilot) to pass 60% of the available RAM or a store limit; or to
  # take longer than its share of the time budget (`--budget`, 480 s by
  # default so that the run ends within 10 minutes; none with `--full`).
  @moduledoc false

  alias Heft.Bench.{Kinds, Measures, Plot, Report, Store, Sys}

  @counts [10_000, 100_000, 1_000_000]
  @full_counts @counts ++ [10_000_000]
  @repeat_up_to 100_000
  # Seconds for the whole default run (the issue allows 10 minutes), and
  # the share of it a cell of the first count may take (nothing predicts
  # their cost yet; the child's pilot checks it).
  @budget_s 480
  @first_count_share 0.06
  @mem_share 0.6

  @switches [
    full: :boolean,
    quick: :boolean,
    kinds: :string,
    stores: :string,
    counts: :string,
    runs: :integer,
    budget: :integer,
    out: :string,
    only: :string,
    measure_runs: :integer,
    measure_records: :integer,
    mixed_seconds: :float,
    ab: :string
  ]

  def parse_args(args) do
    {o, _} = OptionParser.parse!(args, strict: @switches)
    quick = o[:quick] == true
    full = o[:full] == true
    # The matrix and the other measures (Heft.Bench.Measures); --quick is
    # the matrix's smoke run alone.
    parts = [:matrix | Measures.names()]
    default_parts = if quick, do: [:matrix], else: parts
    only = list(o[:only], default_parts, &part!(&1, parts))

    %{
      kinds: list(o[:kinds], if(quick, do: [:small_map], else: Kinds.all()), &kind!/1),
      stores: list(o[:stores], if(quick, do: ["ets"], else: Store.names()), &store!/1),
      counts:
        list(
          o[:counts],
          if(quick, do: [1_000], else: if(full, do: @full_counts, else: @counts)),
          &count!/1
        ),
      runs: o[:runs] || 3,
      budget_s: o[:budget] || if(full, do: nil, else: @budget_s),
      out: o[:out] || "bench/results",
      args: Enum.join(["mix bench" | args], " "),
      matrix: :matrix in only,
      measures: Enum.filter(Measures.names(), &(&1 in only)),
      measure_runs: o[:measure_runs] || 5,
      measure_count: o[:measure_records] || 1_000_000,
      mixed_seconds: o[:mixed_seconds] || 2.0,
      ab: o[:ab] && Path.expand(o[:ab])
    }
  end

  defp part!(name, parts) do
    Enum.find(parts, &(Atom.to_string(&1) == name)) ||
      raise ArgumentError, "unknown part #{name}; known: #{Enum.join(parts, ", ")}"
  end

  defp list(nil, default, _), do: default

  defp list(text, _, fun),
    do: text |> String.split(",", trim: true) |> Enum.map(&fun.(String.trim(&1)))

  defp kind!(name) do
    Enum.find(Kinds.all(), &(Atom.to_string(&1) == name)) ||
      raise ArgumentError, "unknown kind #{name}; known: #{Enum.join(Kinds.all(), ", ")}"
  end

  defp store!(name) do
    Store.fetch!(name)
    name
  end

  defp count!(text), do: text |> String.replace("_", "") |> String.to_integer()

  # Runs the matrix; returns the cells (for tests) after writing the outputs.
  def run(opts) do
    t0 = now_s()
    # The other measures go first and count against the budget.
    deadline = opts.budget_s && t0 + opts.budget_s
    File.mkdir_p!(opts.out)
    machine = Sys.machine()
    host = host_state()
    IO.puts("# mix bench\n\nMachine: #{machine}\nAt start: #{host}\n")
    measures = run_measures(opts, machine, host, t0)

    if opts.matrix, do: run_matrix(opts, machine, host, t0, deadline, measures), else: measures
  end

  # The measures besides the matrix, written to measures.md and
  # measures.csv (and, with the matrix, into results.md).
  defp run_measures(%{measures: []}, _, _, _), do: []

  defp run_measures(opts, machine, host, t0) do
    results = Measures.run(opts, &spawn_cell/2)
    File.write!(Path.join(opts.out, "measures.csv"), Measures.csv(results))

    File.write!(Path.join(opts.out, "measures.md"), """
    # Heft benchmark results: other measures

    `#{opts.args}` on #{Date.utc_today()}, #{Float.round(now_s() - t0, 1)} s.

    Machine: #{machine}

    Host at start: #{host}; at end: #{host_state()}. Other processes on the host perturb the timings.

    #{Measures.markdown(results)}
    #{Measures.goals_markdown(results)}
    """)

    IO.puts(Measures.goals_markdown(results))
    results
  end

  defp run_matrix(opts, machine, host, t0, deadline, measures) do
    IO.puts(Report.header(true))
    counts = Enum.sort(opts.counts)

    cells =
      counts
      |> Enum.reduce([], &run_stage(&1, opts, &2, deadline))
      |> Enum.reverse()

    wall_s = now_s() - t0
    goals = Report.goals(cells)
    IO.puts("\n" <> Report.goals_markdown(goals))
    plots = write_plots(cells, opts)

    run = %{
      host: "at start: #{host}; at end: #{host_state()}",
      machine: machine,
      args: opts.args,
      wall_s: wall_s,
      date: Date.utc_today(),
      plots: plots
    }

    document =
      Report.document(cells, goals, run) <>
        if(measures == [],
          do: "",
          else: "\n" <> Measures.markdown(measures) <> "\n" <> Measures.goals_markdown(measures)
        )

    File.write!(Path.join(opts.out, "results.md"), document)

    IO.puts(
      "Wall time: #{Float.round(wall_s, 1)} s. Wrote #{opts.out}/results.md, results.csv and #{length(plots)} plots."
    )

    cells
  end

  # The cells of one record count, cheapest first (as predicted from the
  # previous count); each runs if it fits in the time left (fits/7). The
  # first count has no predictions; the child's pilot caps its runs.
  defp run_stage(count, opts, done, deadline) do
    planned =
      for kind <- opts.kinds,
          store <- opts.stores,
          do: {kind, store, plan(kind, store, count, opts, done)}

    {skips, runs} = Enum.split_with(planned, &match?({_, _, {:skip, _, _}}, &1))

    done =
      Enum.reduce(skips, done, fn {kind, store, skip}, done ->
        emit(skipped(kind, store, count, skip), opts, done)
      end)

    runs
    |> Enum.sort_by(fn {_, _, {:run, predicted}} -> predicted || 0 end)
    |> Enum.reduce(done, fn {kind, store, {:run, predicted}}, done ->
      cell =
        case fits(kind, store, count, predicted, opts, done, deadline) do
          :ok ->
            cell(kind, store, count, opts, predicted, allowance(predicted, opts, deadline))

          skip ->
            skipped(kind, store, count, skip)
        end

      emit(cell, opts, done)
    end)
  end

  defp skipped(kind, store, count, {:skip, why, reason}),
    do: %{
      kind: kind,
      store: store,
      count: count,
      runs: 0,
      status: :skip,
      why: why,
      reason: reason
    }

  # nil (no time check), or the seconds a first-count cell may take, which
  # the child's pilot checks.
  defp allowance(predicted, opts, deadline) do
    if deadline && predicted == nil, do: opts.budget_s * @first_count_share
  end

  # A predicted cell fits if the pending cells chosen first fit in the time
  # left with it: the goals' cells (ETS and Heft's defaults) before the
  # others, the cheapest first within each, skipping those that do not fit.
  defp fits(_kind, _store, _count, predicted, _opts, _done, deadline)
       when deadline == nil or predicted == nil,
       do: :ok

  defp fits(kind, store, count, predicted, opts, done, deadline) do
    ran = MapSet.new(done, &{&1.kind, &1.store, &1.count})
    time = deadline - now_s()

    pending =
      for c <- opts.counts,
          c >= count,
          kind <- opts.kinds,
          store <- opts.stores,
          not MapSet.member?(ran, {kind, store, c}),
          {:run, s} <- [plan(kind, store, c, opts, done)],
          do: {{kind, store, c}, s || 0}

    {chosen, _} =
      pending
      |> Enum.sort_by(fn {{_, store, _}, s} -> {store not in Report.goal_stores(), s} end)
      |> Enum.reduce({MapSet.new(), 0}, fn {id, s}, {chosen, used} ->
        if used + s <= time, do: {MapSet.put(chosen, id), used + s}, else: {chosen, used}
      end)

    if MapSet.member?(chosen, {kind, store, count}),
      do: :ok,
      else:
        {:skip, :budget,
         "predicted #{round(predicted)} s (scaled from the previous count); the #{round(time)} s " <>
           "left go first to the goals' stores and to cheaper cells"}
  end

  defp emit(cell, opts, done) do
    IO.puts(Report.row(cell, true))
    done = [cell | done]
    File.write!(Path.join(opts.out, "results.csv"), Report.csv(Enum.reverse(done)))
    done
  end

  # {:run, predicted seconds or nil} or {:skip, why, reason}, from the same
  # store and kind at the largest smaller count: a cell that did not measure
  # there is skipped for the same reason; one that did is predicted from it,
  # scaled by the record count, and skipped if its bytes per record times
  # this count pass 60% of the available RAM or the store's limit.
  defp plan(kind, store, count, opts, done) do
    {mod, store_opts} = Store.fetch!(store)

    with :ok <- mod.check(store_opts) do
      case Enum.find(done, &(&1.kind == kind and &1.store == store and &1.count < count)) do
        nil -> {:run, nil}
        %{status: :ok} = prev -> predict(prev, count, runs(count, opts), mod.limit(store_opts))
        prev -> {:skip, prev.why, carried(prev)}
      end
    else
      {:skip, reason} -> {:skip, :api, reason}
    end
  end

  defp predict(prev, count, runs, limit) do
    per = max(Report.value(prev, :bytes), Report.value(prev, :rss_bytes) || 0)
    bytes = per * count
    available = Sys.mem_available()
    from = "#{round(per)} B/record at #{Report.int(prev.count)}"

    cond do
      bytes > @mem_share * available ->
        {:skip, :memory,
         "predicted #{Report.gb(bytes)} (#{from}) > 60% of the #{Report.gb(available)} of RAM available"}

      limit != nil and bytes > elem(limit, 0) ->
        {:skip, :limit, "predicted #{Report.gb(bytes)} (#{from}): #{elem(limit, 1)}"}

      true ->
        {:run, runs * (prev.wall_run - prev.run_s + prev.run_s * count / prev.count)}
    end
  end

  defp carried(%{reason: "as at " <> _ = reason}), do: reason
  defp carried(prev), do: "as at #{Report.int(prev.count)}: #{prev.reason}"

  defp runs(count, opts), do: if(count <= @repeat_up_to, do: opts.runs, else: 1)

  # One cell: its runs (stopping at the first that does not measure). The
  # child skips it after its pilot when it is predicted to pass the memory
  # or store limits or, per run, `allowed` seconds.
  defp cell(kind, store, count, opts, predicted, allowed) do
    runs = runs(count, opts)

    spec = %{
      store: store,
      kind: kind,
      count: count,
      budget_s: if(is_number(allowed), do: allowed / runs),
      predicted_s: predicted && predicted / runs
    }

    t0 = now_s()
    results = run_cell(spec, runs, 1, [])
    wall = now_s() - t0

    %{
      kind: kind,
      store: store,
      count: count,
      runs: 0,
      wall_s: wall,
      wall_run: wall / length(results)
    }
    |> Map.merge(Report.aggregate(results))
  end

  defp run_cell(_spec, runs, i, acc) when i > runs, do: Enum.reverse(acc)

  defp run_cell(spec, runs, i, acc) do
    label = "#{spec.kind} · #{spec.store} · #{Report.int(spec.count)} records · run #{i}/#{runs}"
    dir = Path.join(System.tmp_dir!(), "heft-bench-#{System.pid()}-#{spec.store}")
    result = spawn_cell(Map.put(spec, :dir, dir), label)
    # Only the first run may be skipped for time: the cell is under way.
    spec = %{spec | budget_s: nil}

    if result.status == :ok,
      do: run_cell(spec, runs, i + 1, [result | acc]),
      else: Enum.reverse([result | acc])
  end

  defp host_state do
    "load average #{Sys.load_average()} on #{:erlang.system_info(:logical_processors_available)} cores, " <>
      "#{Report.gb(Sys.mem_available())} of RAM available"
  end

  defp now_s, do: System.monotonic_time(:millisecond) / 1000

  # Runs Heft.Bench.Cell.main/0 in a new `elixir` OS process with this
  # project's compiled code, shows its progress lines (for steps that take
  # more than two seconds) and returns its result.
  defp spawn_cell(spec, label) do
    paths = Path.wildcard(Path.join(Mix.Project.build_path(), "lib/*/ebin"))
    # `--ab DIR`: Heft's code and NIF from another build directory.
    paths =
      case spec[:build] do
        nil ->
          paths

        dir ->
          [Path.join(dir, "lib/heft/ebin") | Enum.reject(paths, &(&1 =~ ~r{/lib/heft/ebin$}))]
      end

    code = "Heft.Bench.Cell.main()"

    args =
      Enum.flat_map(paths, &["-pa", &1]) ++ ["-e", code, "--", Heft.Bench.Cell.encode_spec(spec)]

    port =
      Port.open({:spawn_executable, System.find_executable("elixir")}, [
        :binary,
        :exit_status,
        :stderr_to_stdout,
        {:line, 1_000_000},
        args: args
      ])

    collect(port, label, System.monotonic_time(:millisecond), %{result: nil, output: []})
  end

  defp collect(port, label, t0, acc) do
    receive do
      {^port, {:data, {:eol, "@@result " <> data}}} ->
        collect(port, label, t0, %{
          acc
          | result: data |> Base.decode64!() |> :erlang.binary_to_term()
        })

      {^port, {:data, {:eol, "@@progress " <> line}}} ->
        progress(label, line, t0)
        collect(port, label, t0, acc)

      {^port, {:data, {_, line}}} ->
        collect(port, label, t0, %{acc | output: Enum.take([line | acc.output], 5)})

      {^port, {:exit_status, status}} ->
        if Process.delete(:progress_shown), do: clear_progress()

        cond do
          acc.result != nil ->
            acc.result

          status in [137, 9] ->
            %{status: :error, reason: "killed (exit #{status}; out of memory?)"}

          true ->
            %{
              status: :error,
              reason: "exit #{status}: #{acc.output |> Enum.reverse() |> Enum.join(" / ")}"
            }
        end
    end
  end

  # On a terminal one line, rewritten in place; elsewhere (a log) a line
  # every ten seconds.
  defp progress(label, line, t0) do
    elapsed = System.monotonic_time(:millisecond) - t0
    tty = match?({:ok, _}, :io.columns(:standard_error))
    last = Process.get(:progress_shown, 0)

    if elapsed > 2_000 and (tty or elapsed - last >= 10_000) do
      [total, done | phase] = line |> String.split(" ") |> Enum.reverse()
      phase = phase |> Enum.reverse() |> Enum.join(" ")

      count =
        if done == "0",
          do: "…",
          else: " #{Report.int(String.to_integer(done))}/#{Report.int(String.to_integer(total))}"

      text = "#{label} · #{phase}#{count} · #{div(elapsed, 1000)} s"
      IO.write(:stderr, if(tty, do: "\r" <> String.pad_trailing(text, 110), else: text <> "\n"))
      Process.put(:progress_shown, elapsed)
    end
  end

  defp clear_progress do
    if match?({:ok, _}, :io.columns(:standard_error)),
      do: IO.write(:stderr, "\r" <> String.duplicate(" ", 110) <> "\r")
  end

  # Per kind: bytes per record, insert µs/op (single and batched) and lookup
  # µs/op, each against the record count on log scales.
  defp write_plots(cells, opts) do
    machine = Sys.machine_short()

    for kind <- opts.kinds, {name, plot} <- Report.plots(cells, kind) do
      file = Path.join(opts.out, "#{kind}-#{name}.svg")
      File.write!(file, Plot.svg(Map.put(plot, :subtitle, machine)))
      file
    end
  end
end
