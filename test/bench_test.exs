defmodule Heft.BenchTest do
  # The writers of `mix bench` (Markdown, CSV, goals, SVG) on made-up cells,
  # and a `--quick` smoke run end to end. Structure only, never timings.
  use ExUnit.Case, async: true

  import ExUnit.CaptureIO
  alias Heft.Bench.{Plot, Report}

  defp cell(kind, store, count, figures) do
    stats = Map.new(figures, fn {k, v} -> {k, {v, v * 0.9, v * 1.1}} end)

    %{
      kind: kind,
      store: store,
      count: count,
      status: :ok,
      runs: 3,
      stats: stats,
      overloads: 0,
      run_s: 1.0,
      wall_s: 3.5,
      accounting: "test accounting, with a comma"
    }
  end

  defp skipped(kind, store, count, why, reason),
    do: %{
      kind: kind,
      store: store,
      count: count,
      status: :skip,
      runs: 0,
      why: why,
      reason: reason
    }

  defp cells do
    [
      cell(:small_map, "ets", 10_000, bytes: 176.0, lookup_us: 0.2, insert_us: 0.3, batch_us: 0.2),
      cell(:small_map, "heft_zlib", 10_000,
        bytes: 100.0,
        lookup_us: 0.25,
        insert_us: 0.5,
        batch_us: 0.25
      ),
      cell(:small_map, "ets", 100_000, bytes: 176.0, lookup_us: 0.4, insert_us: 0.5, batch_us: 0.3),
      cell(:small_map, "heft_zlib", 100_000,
        bytes: 110.0,
        lookup_us: 0.8,
        insert_us: 0.6,
        batch_us: 0.4
      ),
      cell(:tuple100, "ets", 10_000,
        bytes: 16_873.0,
        lookup_us: 6.0,
        insert_us: 11.0,
        batch_us: 10.0
      ),
      cell(:tuple100, "heft_zlib", 10_000,
        bytes: 150.0,
        lookup_us: 4.0,
        insert_us: 9.0,
        batch_us: 5.0
      ),
      skipped(:tuple100, "ets", 1_000_000, :memory, "predicted 16.9 GB > 60% of RAM"),
      skipped(:small_map, "heft_none", 10_000, :api, "Heft API not present yet (no Heft.new/2)"),
      skipped(:json_1k, "heft_zlib", 10_000, :api, "Heft API not present yet (no Heft.new/2)")
    ]
  end

  defp columns(line), do: line |> String.split("|") |> length()

  test "Markdown rows have as many columns as the header, skips say why" do
    header = Report.header() |> String.split("\n") |> hd()

    for c <- cells() do
      assert columns(Report.row(c)) == columns(header)
      assert columns(Report.row(c, true)) == columns(header) + 1
    end

    assert Report.row(Enum.at(cells(), 6)) =~ "skipped: predicted 16.9 GB"
    assert Report.row(hd(cells())) =~ "| 10,000 | ets | 3 | 0.300 (0.270–0.330) |"
  end

  test "CSV has a header and one row per cell, with the same number of fields" do
    [header | rows] = cells() |> Report.csv() |> String.split("\n", trim: true)

    assert String.starts_with?(
             header,
             "kind,store,records,status,runs,insert_us,insert_us_min,insert_us_max,"
           )

    assert length(rows) == length(cells())
    # The quoted note holds a comma; drop it before counting fields.
    fields = fn line ->
      line |> String.replace(~r/"[^"]*"/, "x") |> String.split(",") |> length()
    end

    assert Enum.all?(rows, &(fields.(&1) == fields.(header)))
    assert Enum.any?(rows, &String.starts_with?(&1, "tuple100,ets,1000000,skip,0,"))
  end

  test "goals are ratios against ETS from the cells: met, missed, or not measured with the reason" do
    goals = Report.goals(cells())

    find = fn text, store ->
      Enum.find(goals, &(String.starts_with?(&1.goal, text) and &1.store == store))
    end

    tuple = find.("100-tuple record: bytes", "heft_zlib")
    assert tuple.status == :met
    assert_in_delta tuple.worst.ratio, 150 / 16_873, 1.0e-9

    map_bytes = find.("small map record: bytes", "heft_zlib")
    assert map_bytes.status == :met
    assert map_bytes.worst.count == 100_000

    lookup = find.("small map record: lookup", "heft_zlib")
    assert lookup.status == :missed
    assert_in_delta lookup.worst.ratio, 2.0, 1.0e-9

    assert Enum.all?(goals, &(&1.store == "heft_zlib"))

    json = Report.goals(Enum.filter(cells(), &(&1.kind in [:json_1k, :tuple100])))
    batch = Enum.find(json, &String.starts_with?(&1.goal, "batch insert"))
    # tuple100 measured; json_1k's Heft cell skipped: judged on what ran
    assert batch.status == :met

    only_json = Report.goals(Enum.filter(cells(), &(&1.kind == :json_1k)))
    assert Enum.all?(only_json, &(&1.status == :unmeasured))
    assert Enum.find(only_json, &(&1.goal =~ "batch")).reason =~ "Heft API not present yet"

    markdown = Report.goals_markdown(goals)
    assert markdown =~ "**MISSED**: 0.800 µs vs ETS 0.400 µs at 100,000 (small_map)"
    assert markdown =~ "| met:"
  end

  test "Heft against ETS: one row per measured Heft cell with an ETS cell of the same kind and count" do
    markdown = Report.ratios_markdown(cells())
    assert markdown =~ "| small_map | 100,000 | heft_zlib | 0.625 | 1.20 | 1.33 | 2.00 |"
    assert length(Regex.scan(~r/^\| (small_map|tuple100) \|/m, markdown)) == 3
  end

  test "the SVG plot is well-formed XML with log ticks, axis titles, legend and markers" do
    [{"bytes", bytes} | _] = plots = Report.plots(cells(), :small_map)
    assert length(plots) == 3
    svg = Plot.svg(Map.put(bytes, :subtitle, "a machine & its <OS>"))

    {doc, _} = svg |> :binary.bin_to_list() |> :xmerl_scan.string(quiet: true)
    assert elem(doc, 0) == :xmlElement

    texts =
      Regex.scan(~r/<text[^>]*>([^<]*)<\/text>/, svg, capture: :all_but_first) |> List.flatten()

    assert "Bytes per record — small map record" in texts
    assert "a machine &amp; its &lt;OS&gt;" in texts
    assert "records in the table" in texts
    assert "bytes per record (store's accounting)" in texts
    assert Enum.all?(["10k", "100k", "ets", "heft_zlib"], &(&1 in texts))
    assert Enum.any?(texts, &(&1 =~ "not measured — heft_none" == false))
    # one line per store, a marker per point
    assert length(Regex.scan(~r/<polyline /, svg)) == 2
    assert length(Regex.scan(~r/<circle /, svg)) >= 2
  end

  test "log-scale tick labels" do
    assert Enum.map([0.01, 0.5, 2.0, 100.0, 2000.0, 10_000.0, 1.0e6], &Plot.tick/1) ==
             ["0.01", "0.5", "2", "100", "2k", "10k", "1M"]
  end

  @tag timeout: 120_000
  test "mix bench --quick runs end to end and writes the table, CSV and plots" do
    out = Path.join(System.tmp_dir!(), "heft-bench-test-#{System.unique_integer([:positive])}")
    on_exit(fn -> File.rm_rf(out) end)

    output =
      capture_io(fn -> Heft.Bench.run(Heft.Bench.parse_args(["--quick", "--out", out])) end)

    assert output =~ "| kind | records | store | runs | insert µs/op |"
    assert output =~ ~r/\| small_map \| 1,000 \| ets \| 3 \| [\d.]+ \(/
    assert output =~ "## Goals (ratios against ETS, from this run)"
    assert output =~ "Wall time:"

    [_header, row] =
      out |> Path.join("results.csv") |> File.read!() |> String.split("\n", trim: true)

    assert String.starts_with?(row, "small_map,ets,1000,ok,3,")

    for plot <- ~w(bytes insert lookup),
        do: assert(File.read!(Path.join(out, "small_map-#{plot}.svg")) =~ "<svg")

    assert File.read!(Path.join(out, "results.md")) =~ "# Heft benchmark results"
  end
end
