defmodule Heft.Bench.Report do
  # Turns cell results into text: the Markdown rows printed as the bench
  # goes, the CSV, the goals (ratios against ETS from the same run), the data
  # for the plots, and results.md, which gathers it all.
  #
  # A cell is %{kind, store, count, status: :ok | :skip | :error, runs, ...};
  # a measured cell has `stats`, a map from metric to {median, min, max}.
  @moduledoc false

  alias Heft.Bench.{Kinds, Store}

  # Metric, column title, shown with its min–max spread.
  @metrics [
    {:insert_us, "insert µs/op", true},
    {:batch_us, "batch insert µs/op", true},
    {:lookup_us, "lookup µs/op", true},
    {:bytes, "bytes/rec (store)", false},
    {:rss_bytes, "bytes/rec (RSS)", false},
    {:load_ms, "load ms", true},
    {:disk_bytes, "disk bytes/rec", false},
    {:written_bytes, "written bytes/rec", false},
    {:payload_ratio, "payload stored/raw", false}
  ]
  @metric_keys Enum.map(@metrics, &elem(&1, 0))

  # Each goal: text, record kinds, the metric, what it is judged against,
  # the target (max, shown as), and the stores it is stated for.
  # Against: {store, metric} - the ratio to that store's metric at the same
  # kind and count ("ets", or "heft_none", the same table with
  # `compression: :none`); {:count, n} - the value itself at n records;
  # :value - the value itself at every count.
  # Issue 5's goals are stated for Heft with its defaults (compression:
  # :zlib, arena: :memory); issue 12's for the codec stores. The other Heft
  # stores are in the ratios table.
  @defaults ["heft_zlib"]
  @codecs ["heft_zstd_dict", "heft_zstd", "heft_lz4"]
  @goals [
    {"100-tuple record: bytes/record vs ETS", [:tuple100], :bytes, {"ets", :bytes},
     {1 / 80, "1/80"}, @defaults},
    {"small map record: bytes/record vs ETS", [:small_map], :bytes, {"ets", :bytes},
     {2 / 3, "2/3"}, @defaults},
    {"small map record: lookup µs/op vs ETS", [:small_map], :lookup_us, {"ets", :lookup_us},
     {1.5, "1.5"}, @defaults},
    {"100-tuple record: lookup µs/op vs ETS", [:tuple100], :lookup_us, {"ets", :lookup_us},
     {1.0, "1.0"}, @defaults},
    {"batch insert µs/op vs ETS single insert (every kind)", Kinds.all(), :batch_us,
     {"ets", :insert_us}, {1.0, "1.0"}, @defaults},
    # Issue 12
    {"small map record at 1M: bytes/record, index included", [:small_map], :bytes,
     {:count, 1_000_000}, {35, "35 B"}, @codecs},
    {"JSON-like 1 KB record: stored payload / raw payload", [:json_1k], :payload_ratio, :value,
     {1 / 8, "1/8"}, ["heft_zstd_dict", "heft_zstd"]},
    {"JSON-like 1 KB record: bytes/record vs ETS", [:json_1k], :bytes, {"ets", :bytes},
     {1 / 8, "1/8"}, ["heft_zstd_dict", "heft_zstd"]},
    {"100-tuple record at 1M: bytes/record, index included", [:tuple100], :bytes,
     {:count, 1_000_000}, {30, "30 B"}, @codecs},
    {"lookup µs/op vs `compression: :none` (every kind)", Kinds.all(), :lookup_us,
     {"heft_none", :lookup_us}, {1.3, "1.3"}, ["heft_zstd_dict"]},
    {"lookup µs/op vs `compression: :none` (every kind)", Kinds.all(), :lookup_us,
     {"heft_none", :lookup_us}, {1.1, "1.1"}, ["heft_lz4"]},
    {"random 1 KB record (stored raw): bytes/record vs `compression: :none`", [:random_1k],
     :bytes, {"heft_none", :bytes}, {1.02, "1.02"}, ["heft_zlib" | @codecs]},
    {"random 1 KB record (stored raw): lookup µs/op vs `compression: :none`", [:random_1k],
     :lookup_us, {"heft_none", :lookup_us}, {1.1, "1.1"}, ["heft_zlib" | @codecs]}
  ]

  # The stores the goals compare: their cells go first in the time budget.
  def goal_stores do
    refs = for {_, _, _, {store, _}, _, _} <- @goals, do: store
    stores = for {_, _, _, _, _, stores} <- @goals, s <- stores, do: s
    Enum.uniq(refs ++ stores)
  end

  ## Aggregation

  # The runs of one cell: medians with min and max, or the first run that
  # did not measure.
  def aggregate(results) do
    case Enum.find(results, &(&1.status != :ok)) do
      nil ->
        %{
          status: :ok,
          runs: length(results),
          stats: Map.new(@metric_keys, fn m -> {m, stat(Enum.map(results, & &1[m]))} end),
          overloads: results |> Enum.map(& &1.overloads) |> stat() |> elem(0),
          run_s: results |> Enum.map(& &1.run_s) |> stat() |> elem(0),
          accounting: hd(results).accounting,
          note: results |> Enum.map(&Map.get(&1, :note)) |> Enum.reject(&is_nil/1) |> List.last()
        }

      failed ->
        %{status: failed.status, why: Map.get(failed, :why, :error), reason: failed.reason}
    end
  end

  def stat(values) do
    case values |> Enum.reject(&is_nil/1) |> Enum.sort() do
      [] -> nil
      sorted -> {median(sorted), hd(sorted), List.last(sorted)}
    end
  end

  defp median(sorted) do
    n = length(sorted)
    mid = div(n, 2)

    if rem(n, 2) == 1,
      do: Enum.at(sorted, mid),
      else: (Enum.at(sorted, mid - 1) + Enum.at(sorted, mid)) / 2
  end

  def value(%{status: :ok, stats: stats}, metric), do: with({m, _, _} <- stats[metric], do: m)
  def value(_, _), do: nil

  ## Markdown rows

  # With `kind?` the kind is the first column (the live table mixes kinds).
  def header(kind? \\ false) do
    titles =
      if(kind?, do: ["kind"], else: []) ++
        ["records", "store", "runs"] ++
        columns(Enum.map(@metrics, &elem(&1, 1)), "RSS/store") ++ ["notes"]

    "| " <> Enum.join(titles, " | ") <> " |\n|" <> String.duplicate("---|", length(titles))
  end

  def row(cell, kind? \\ false)

  def row(%{status: :ok} = cell, kind?) do
    figures =
      Enum.map(@metrics, fn {m, _, spread?} ->
        figure(cell.stats[m], spread? and cell.runs > 1)
      end)

    line(cell, kind?, [runs(cell)] ++ columns(figures, rss_ratio(cell)) ++ [notes(cell)])
  end

  def row(cell, kind?) do
    dashes = List.duplicate("–", length(@metrics) + 2)
    verb = if cell.status == :skip, do: "skipped", else: "failed"
    line(cell, kind?, dashes ++ ["#{verb}: #{cell.reason}"])
  end

  defp line(cell, kind?, rest) do
    "| " <>
      Enum.join(
        if(kind?, do: [cell.kind], else: []) ++ [int(cell.count), cell.store | rest],
        " | "
      ) <> " |"
  end

  # The metric columns with RSS/store put after the RSS column.
  defp columns(metric_columns, ratio) do
    {upto_rss, rest} =
      Enum.split(metric_columns, Enum.find_index(@metric_keys, &(&1 == :rss_bytes)) + 1)

    upto_rss ++ [ratio | rest]
  end

  defp runs(%{runs: 1, count: c}) when c > 100_000, do: "1 (once)"
  defp runs(%{runs: n}), do: "#{n}"

  defp rss_ratio(cell) do
    case {value(cell, :rss_bytes), value(cell, :bytes)} do
      {r, b} when is_number(r) and is_number(b) and r > 0 and b > 0 -> num(r / b)
      _ -> "–"
    end
  end

  defp notes(cell) do
    Enum.join(
      [
        if(cell.overloads > 0, do: "Mnesia overloaded ×#{round(cell.overloads)}"),
        if(cell.store == "dets", do: "store bytes = file size"),
        cell[:note]
      ]
      |> Enum.reject(&is_nil/1),
      "; "
    )
  end

  defp figure(nil, _), do: "–"
  defp figure({m, _, _}, false), do: num(m)
  defp figure({m, lo, hi}, true), do: "#{num(m)} (#{num(lo)}–#{num(hi)})"

  # Three significant figures or so; thousands separated.
  def num(nil), do: "–"
  def num(x) when x == 0, do: "0"
  def num(x) when abs(x) >= 100, do: int(round(x))
  def num(x) when abs(x) >= 10, do: :erlang.float_to_binary(x / 1, decimals: 1)
  def num(x) when abs(x) >= 1, do: :erlang.float_to_binary(x / 1, decimals: 2)
  def num(x) when abs(x) >= 0.001, do: :erlang.float_to_binary(x / 1, decimals: 3)
  def num(x), do: :io_lib.format("~.2e", [x / 1]) |> to_string()

  def int(n) when n < 0, do: "-" <> int(-n)

  def int(n) do
    n
    |> Integer.to_string()
    |> String.reverse()
    |> String.replace(~r/(\d{3})(?=\d)/, "\\1,")
    |> String.reverse()
  end

  # Kind, then record count, then store, each in its usual order.
  def sorted(cells) do
    Enum.sort_by(cells, &{index(Kinds.all(), &1.kind), &1.count, index(Store.names(), &1.store)})
  end

  defp index(list, item), do: Enum.find_index(list, &(&1 == item))

  ## CSV

  def csv(cells) do
    metric_cols = Enum.flat_map(@metric_keys, &["#{&1}", "#{&1}_min", "#{&1}_max"])

    header =
      Enum.join(
        ["kind", "store", "records", "status", "runs"] ++
          metric_cols ++ ["mnesia_overloads", "wall_s", "note"],
        ","
      )

    rows =
      Enum.map(sorted(cells), fn cell ->
        figures =
          Enum.flat_map(@metric_keys, fn m ->
            case cell[:stats][m] do
              nil -> ["", "", ""]
              {a, b, c} -> [csv_num(a), csv_num(b), csv_num(c)]
            end
          end)

        note = if cell.status == :ok, do: cell.accounting, else: cell.reason
        overloads = if cell.status == :ok, do: csv_num(cell.overloads), else: ""
        wall = if cell[:wall_s], do: csv_num(cell.wall_s), else: ""

        Enum.join(
          [cell.kind, cell.store, cell.count, cell.status, cell.runs] ++
            figures ++ [overloads, wall, csv_quote(note)],
          ","
        )
      end)

    Enum.join([header | rows], "\n") <> "\n"
  end

  defp csv_num(x) when is_integer(x), do: Integer.to_string(x)
  defp csv_num(x), do: :erlang.float_to_binary(x / 1, [:compact, decimals: 6])
  defp csv_quote(text), do: ~s(") <> String.replace(to_string(text), ~s("), ~s("")) <> ~s(")

  ## Goals

  # For each goal and store: the value or ratio at every count where it
  # was measured (and its reference was), the worst of them, and whether it
  # meets the target.
  def goals(cells) do
    for {text, kinds, metric, against, {max, target}, stores} <- @goals, store <- stores do
      pairs =
        for kind <- kinds,
            h <- cells,
            h.kind == kind and h.store == store and h.status == :ok,
            pair = pair(cells, h, metric, against),
            pair != nil,
            do: pair

      base = %{
        goal: text,
        store: store,
        max: max,
        target: target,
        metric: metric,
        against: against,
        pairs: pairs
      }

      case pairs do
        [] ->
          Map.merge(base, %{status: :unmeasured, reason: unmeasured(cells, kinds, store, against)})

        _ ->
          worst = Enum.max_by(pairs, & &1.ratio)

          Map.merge(base, %{status: if(worst.ratio <= max, do: :met, else: :missed), worst: worst})
      end
    end
  end

  # %{kind, count, heft: value, ets: reference value or nil, ratio} for
  # one measured cell, or nil where the goal does not judge it.
  defp pair(cells, h, metric, against) do
    hv = value(h, metric)

    case against do
      _ when not is_number(hv) ->
        nil

      {store, ref_metric} when is_binary(store) ->
        with %{status: :ok} = r <- find(cells, h.kind, store, h.count),
             rv when is_number(rv) and rv > 0 <- value(r, ref_metric) do
          %{kind: h.kind, count: h.count, heft: hv, ets: rv, ratio: hv / rv}
        else
          _ -> nil
        end

      {:count, n} when h.count != n ->
        nil

      _ ->
        %{kind: h.kind, count: h.count, heft: hv, ets: nil, ratio: hv}
    end
  end

  defp find(cells, kind, store, count),
    do: Enum.find(cells, &(&1.kind == kind and &1.store == store and &1.count == count))

  defp unmeasured(cells, kinds, store, against) do
    case Enum.find(cells, &(&1.kind in kinds and &1.store == store and &1.status != :ok)) do
      nil ->
        case against do
          {ref, _} when is_binary(ref) ->
            "no #{store} and #{ref} cells measured at the same count"

          {:count, n} ->
            "no #{store} cell measured at #{int(n)} records"

          :value ->
            "no #{store} cell measured"
        end

      cell ->
        "#{store} #{if cell.status == :skip, do: "skipped", else: "failed"}: #{cell.reason}"
    end
  end

  # Every Heft cell against the ETS cell of the same kind and count: the
  # ratio of each figure (below 1: Heft is smaller or faster).
  def ratios_markdown(cells) do
    metrics = [
      bytes: "bytes/rec",
      insert_us: "insert",
      batch_us: "batch insert",
      lookup_us: "lookup"
    ]

    rows =
      for h <- sorted(cells),
          String.starts_with?(h.store, "heft"),
          h.status == :ok,
          e = find(cells, h.kind, "ets", h.count),
          e != nil and e.status == :ok do
        ratios = Enum.map(metrics, fn {m, _} -> ratio(value(h, m), value(e, m)) end)
        "| #{h.kind} | #{int(h.count)} | #{h.store} | " <> Enum.join(ratios, " | ") <> " |"
      end

    titles = ["kind", "records", "store" | Enum.map(metrics, &elem(&1, 1))]

    Enum.join(
      [
        "## Heft against ETS (ratio Heft / ETS, same run; below 1 is smaller or faster)\n",
        "| " <> Enum.join(titles, " | ") <> " |",
        "|" <> String.duplicate("---|", length(titles)) | rows
      ],
      "\n"
    ) <> "\n"
  end

  defp ratio(h, e) when is_number(h) and is_number(e) and e > 0, do: num(h / e)
  defp ratio(_, _), do: "–"

  def goals_markdown(goals) do
    rows =
      Enum.map(goals, fn g ->
        target = "≤ #{g.target}"

        case g.status do
          :unmeasured ->
            "| #{g.goal} | #{g.store} | – | #{target} | not measured: #{g.reason} |"

          _ ->
            w = g.worst

            each =
              Enum.map_join(
                g.pairs,
                ", ",
                &"#{short(&1.count)}#{kind_tag(g, &1)}: #{num(&1.ratio)}"
              )

            verdict = if g.status == :met, do: "met", else: "**MISSED**"

            "| #{g.goal} | #{g.store} | #{num(w.ratio)} (#{each}) | #{target} | #{verdict}: " <>
              "#{versus(g, w)} at #{int(w.count)} (#{w.kind}) |"
        end
      end)

    Enum.join(
      [
        "## Goals (from this run)\n",
        "Issue 5's goals: Heft with its defaults (`compression: :zlib`, `arena: :memory`) " <>
          "against an ETS set. Issue 12's: the codec stores (heft_zstd_dict: " <>
          "`compression: {:zstd, dictionary: :auto}`, measured with its dictionary in use; " <>
          "heft_zstd; heft_lz4) against an ETS set, against the same kind's " <>
          "`compression: :none` store (heft_none), or by their value at 1,000,000 records " <>
          "(bytes per record, index included) or at every count (payload stored / raw). " <>
          "The worst ratio (or value) over the record counts measured decides.\n",
        "| goal | store | ratio: worst (each count) | target | result |",
        "|---|---|---|---|---|" | rows
      ],
      "\n"
    ) <> "\n"
  end

  defp versus(%{against: {ref, _}} = g, w) when is_binary(ref),
    do: "#{unit(g.metric, w.heft)} vs #{ref_name(ref)} #{unit(g.metric, w.ets)}"

  defp versus(g, w), do: unit(g.metric, w.heft)

  defp ref_name("ets"), do: "ETS"
  defp ref_name(store), do: store

  defp kind_tag(%{pairs: pairs}, pair) do
    if pairs |> Enum.map(& &1.kind) |> Enum.uniq() |> length() > 1, do: " #{pair.kind}", else: ""
  end

  defp unit(:bytes, x), do: "#{num(x)} B"
  defp unit(:payload_ratio, x), do: num(x)
  defp unit(_, x), do: "#{num(x)} µs"

  def gb(b) when b >= 1.0e9, do: "#{Float.round(b / 1.0e9, 1)} GB"
  def gb(b), do: "#{Float.round(b / 1.0e6, 1)} MB"

  # 10k, 100k, 1M, 10M.
  def short(n) when n >= 1_000_000, do: "#{div(n, 1_000_000)}M"
  def short(n) when n >= 1_000, do: "#{div(n, 1_000)}k"
  def short(n), do: "#{n}"

  ## Plots

  # The plots of one kind: {file suffix, plot data for Heft.Bench.Plot}.
  def plots(cells, kind) do
    cells = Enum.filter(cells, &(&1.kind == kind))
    label = Kinds.label(kind)
    x_title = "records in the table"

    [
      {"bytes",
       %{
         title: "Bytes per record — #{label}",
         x_title: x_title,
         y_title: "bytes per record (store's accounting)",
         series: series(cells, :bytes, nil),
         notes: skipped(cells)
       }},
      {"insert",
       %{
         title: "Insert time — #{label}",
         x_title: x_title,
         y_title: "µs per insert",
         series: series(cells, :insert_us, nil) ++ series(cells, :batch_us, "batch of 1,000"),
         notes: ["solid: one record per call; dashed: batches of 1,000" | skipped(cells)]
       }},
      {"lookup",
       %{
         title: "Lookup time (random keys) — #{label}",
         x_title: x_title,
         y_title: "µs per lookup",
         series: series(cells, :lookup_us, nil),
         notes: skipped(cells)
       }}
    ]
  end

  defp series(cells, metric, variant) do
    for store <- Enum.uniq(Enum.map(cells, & &1.store)),
        points = points(cells, store, metric),
        points != [] do
      %{
        name: if(store == "dets" and metric == :bytes, do: "dets (file size)", else: store),
        style: Enum.find_index(Store.names(), &(&1 == store)),
        dashed: variant != nil,
        legend: variant == nil,
        points: points
      }
    end
  end

  defp points(cells, store, metric) do
    for %{store: ^store, status: :ok} = c <- cells,
        {m, lo, hi} <- [c.stats[metric]],
        m > 0,
        do: {c.count, m, lo, hi}
  end

  defp skipped(cells) do
    cells
    |> Enum.filter(&(&1.status != :ok and &1.why != :api))
    |> Enum.group_by(&{&1.store, &1.why})
    |> Enum.map(fn {{store, why}, cs} ->
      "#{store} at #{Enum.map_join(cs, ", ", &short(&1.count))}: #{why(why)}"
    end)
    |> Enum.sort()
    |> then(fn
      [] -> []
      notes -> ["not measured — " <> Enum.join(notes, "; ")]
    end)
  end

  defp why(:memory), do: "over 60% of RAM"
  defp why(:limit), do: "store size limit"
  defp why(:budget), do: "over time budget"
  defp why(_), do: "failed"

  ## results.md

  def document(cells, goals, run) do
    kinds = cells |> Enum.map(& &1.kind) |> Enum.uniq()

    sections =
      Enum.map(kinds, fn kind ->
        rows = cells |> Enum.filter(&(&1.kind == kind)) |> sorted() |> Enum.map(&row/1)
        plots = Enum.filter(run.plots, &String.starts_with?(Path.basename(&1), "#{kind}-"))

        images =
          Enum.map_join(plots, "\n", &"![#{Path.basename(&1, ".svg")}](#{Path.basename(&1)})")

        "## #{Kinds.describe(kind)}\n\n#{header()}\n#{Enum.join(rows, "\n")}\n\n#{images}\n"
      end)

    accounting =
      cells
      |> Enum.filter(&(&1.status == :ok))
      |> Enum.uniq_by(& &1.store)
      |> Enum.map_join("\n", &"  - #{&1.store}: #{&1.accounting}")

    """
    # Heft benchmark results

    `#{run.args}` on #{run.date}, wall time #{Float.round(run.wall_s, 1)} s.

    Machine: #{run.machine}

    Host #{run.host}. Other processes on the host perturb the timings; the memory figures do not depend on them.

    #{Enum.join(sections, "\n")}
    #{goals_markdown(goals)}
    #{ratios_markdown(cells)}
    ## How the figures are taken

    - Each run of a cell is a fresh OS process; counts up to 100,000 are the median of the runs, with min–max in brackets for times; larger counts run once.
    - insert: N records, one per call; batch insert: N records in calls of 1,000 (Mnesia: one transaction each), into a fresh table; lookup: 200,000 random existing keys (or as many as 2 s allow, at least 1,000), generated before timing.
    - bytes/rec (store): the store's own accounting after inserting N records, plus the growth of the VM's binary memory (the refc binaries ETS and Mnesia point to but do not count), divided by N:
    #{accounting}
    - bytes/rec (RSS): growth of the OS process's VmRSS over the insert phase, divided by N; RSS/store is their ratio (allocator overhead, or memory the store's accounting misses).
    - payload stored/raw: Heft's `:payload_stored_bytes` / `:payload_raw_bytes` (records' headers, keys and bodies as stored, against keys and bodies as encoded).
    - heft_zstd_dict (`compression: {:zstd, dictionary: :auto}`) is measured with its dictionary in use: after the timed inserts (which include the table's own training, due at 4,096 records, on a thread of its own), the cell waits, untimed, for the training and the background re-compression of older records to finish (or trains with `Heft.train_dictionary/2` a table that never reached 4,096 records), and fails if more than 1% of the records are still plain zstd; the notes column gives the share of records compressed with the dictionary. The batch insert phase is a fresh table, timed as it goes.
    - load ms: close, then reopen until the table answers (Mnesia: stop, start, wait_for_tables; DETS: open_file, which reads lazily).
    - disk bytes/rec: space allocated in the store's directory (after close, for the stores that persist); written bytes/rec: /proc/self/io write_bytes growth over insert, lookups and close.
    - A cell is skipped, with its reason, when the same store at the previous count (or, at the first count, a 1,000-record pilot) predicts more than 60% of the available RAM or a store limit (DETS: 2 GB), or when it does not fit in the time left: the time goes first to the cells the goals compare (ETS, Heft with its defaults), then to the cheapest.
    """
  end
end
