defmodule Heft.Report do
  @moduledoc """
  An observer-style text view of a node's memory, for the shell.

      iex> Heft.Report.print()
      Heft memory report: app@web1  2025-11-30 02:24:59Z
      Host   RAM 23.5 GiB, available 22.9 GiB (97%), free 21.6 GiB, swap none
      ...

  The view has a host line (RAM, swap, dirty page cache, cgroup, the
  kernel's dirty budget, I/O pressure), a node line (RSS and what it is
  made of), a table of tables (ETS and Heft, largest first) and the
  warnings. Figures are in KiB, MiB and GiB (1024-based); the exact bytes
  are in the data, `Heft.Memory.snapshot/0`, which is what is rendered.

  `top/1` redraws it in place every few seconds, and `mix heft.report`
  prints it from the command line, for this node or a running one
  (`--node NAME`).
  """

  alias Heft.Memory
  alias Heft.Memory.{Remote, Units}

  @width 80

  @doc """
  Prints the report.

  `arg` is a snapshot (from `Heft.Memory.snapshot/0`, or one taken on another
  node) or options:

    * `:node`: report on this connected node instead (see
      `mix heft.report --node`); collected there with `:erpc`.
    * `:width`: columns to fit (default 80).
    * `:tables`: how many table rows to show (default 15).
    * `:device`: where to write (default `:stdio`).

  Returns `:ok`.
  """
  @spec print(map | keyword) :: :ok
  def print(arg \\ [])

  def print(snapshot) when is_map(snapshot), do: print(snapshot, [])
  def print(opts) when is_list(opts), do: print(snapshot(opts), opts)

  @doc "Prints `snapshot` with `opts` (`:width`, `:tables`, `:device`) as in `print/1`."
  @spec print(map, keyword) :: :ok
  def print(snapshot, opts) when is_map(snapshot) do
    IO.write(Keyword.get(opts, :device, :stdio), render(snapshot, opts))
  end

  @doc """
  Redraws the report every `:interval` seconds (default 2; fractions allowed)
  until you type `q` and Enter, like `top`.

  It draws on the terminal's alternate screen, moving the cursor home and
  overwriting each line, so the scrollback does not fill with copies; on
  the way out it restores the screen and prints the last report once.
  Options as in `print/1`, plus `:iterations` (stop after that many
  redraws; input is then not read unless `input: true`). Returns `:ok`.
  """
  @spec top(keyword) :: :ok
  def top(opts \\ []) do
    device = Keyword.get(opts, :device, :stdio)
    interval = round(Keyword.get(opts, :interval, 2) * 1000)
    iterations = Keyword.get(opts, :iterations, :infinity)
    reader = if Keyword.get(opts, :input, iterations == :infinity), do: start_reader()
    # Alternate screen, cursor hidden.
    IO.write(device, "\e[?1049h\e[?25l")

    last =
      try do
        loop(opts, device, interval, iterations, reader, nil)
      after
        IO.write(device, "\e[?25h\e[?1049l")
        if reader, do: Process.exit(reader, :kill)
      end

    if last, do: IO.write(device, last)
    :ok
  end

  defp loop(_opts, _device, _interval, 0, _reader, last), do: last

  defp loop(opts, device, interval, n, reader, _last) do
    snapshot = snapshot(opts)
    rows = rows(device)
    footer = "refreshing every #{interval / 1000} s; q + Enter quits"
    lines = fit_rows(snapshot, opts, rows - 1) ++ [footer]
    # Home, each line then erase-to-end-of-line, then erase below: no full
    # clear (tmux and others copy a cleared screen into the scrollback).
    # No newline after the last line: on the bottom row it would scroll.
    IO.write(device, ["\e[H", Enum.intersperse(Enum.map(lines, &[&1, "\e[K"]), "\n"), "\e[J"])

    next = if n == :infinity, do: n, else: n - 1
    text = render(snapshot, opts)

    receive do
      {:heft_top, :quit} -> text
    after
      interval -> loop(opts, device, interval, next, reader, text)
    end
  end

  # The report in at most `rows` lines: fewer table rows first, then cut.
  # A frame taller than the screen would scroll, and the next frame would
  # start lower than home.
  defp fit_rows(snapshot, opts, rows) do
    lines = snapshot |> render(opts) |> String.split("\n", trim: true)
    over = length(lines) - rows
    tables = Keyword.get(opts, :tables, 15)

    lines =
      if over > 0 and tables > 0,
        do:
          snapshot
          |> render(Keyword.put(opts, :tables, max(tables - over, 1)))
          |> String.split("\n", trim: true),
        else: lines

    Enum.take(lines, max(rows, 1))
  end

  # The terminal's height: the io server knows it in a shell (iex); under
  # `elixir -e` or `mix` it does not, so ask the controlling terminal.
  defp rows(device) do
    case :io.rows(device) do
      {:ok, rows} -> rows
      _ -> tty_rows()
    end
  end

  # The terminal our stdout is (/proc/self/fd/1 -> /dev/pts/N), asked with
  # stty -F: a port's child has no controlling terminal, so /dev/tty would
  # not do. 24 rows when stdout is no terminal.
  defp tty_rows do
    with {:ok, "/dev/" <> _ = tty} <- File.read_link("/proc/self/fd/1"),
         stty when is_binary(stty) <- System.find_executable("stty"),
         {out, 0} <- System.cmd(stty, ["-F", tty, "size"], stderr_to_stdout: true),
         [{rows, ""}, {_cols, ""}] when rows > 0 <- Enum.map(String.split(out), &Integer.parse/1) do
      rows
    else
      _ -> 24
    end
  end

  # Reads lines from the shell's input while top runs; "q" ends it. Killed
  # when top returns, which only happens after a "q" it has already read or,
  # with :iterations, when it was never started.
  defp start_reader do
    parent = self()

    spawn_link(fn ->
      Stream.repeatedly(fn -> IO.gets("") end)
      |> Enum.find(fn line -> not is_binary(line) or String.trim(line) == "q" end)

      send(parent, {:heft_top, :quit})
    end)
  end

  defp snapshot(opts) do
    case Keyword.get(opts, :node) do
      nil -> Memory.snapshot()
      node -> Remote.snapshot(node)
    end
  end

  @doc """
  The report as a string, lines at most `opts[:width]` (default 80)
  columns. Options as in `print/1`.
  """
  @spec render(map, keyword) :: String.t()
  def render(snapshot, opts \\ []) do
    width = Keyword.get(opts, :width, @width)

    [
      header(snapshot),
      host(snapshot.host, width),
      node(snapshot.node, width),
      tables(snapshot.tables, width, Keyword.get(opts, :tables, 15)),
      warnings(snapshot.warnings, width)
    ]
    |> List.flatten()
    |> Enum.map(&fit(&1, width))
    |> Enum.map_join("", &(&1 <> "\n"))
  end

  defp header(s) do
    at = if s[:collected_at], do: "  " <> Calendar.strftime(s.collected_at, "%Y-%m-%d %H:%M:%SZ")
    "Heft memory report: #{s.node_name}#{at}"
  end

  # -- host -------------------------------------------------------------------

  defp host(h, width) do
    [
      wrap(
        "RAM #{b(h.mem_total)}, available #{b(h.mem_available)}" <>
          "#{pct(h.mem_available, h.mem_total)}, free #{b(h.mem_free)}, #{swap(h)}",
        width,
        "Host   "
      ),
      wrap(
        "page cache #{b(h.cached)}, dirty #{b(h.dirty)}, writeback #{b(h.writeback)}",
        width
      ),
      wrap(cgroup(h.cgroup), width),
      wrap(budget(h.dirty_limits), width),
      wrap(io(h.io_pressure), width)
    ]
  end

  defp swap(%{swap_total: 0}), do: "swap none"
  defp swap(%{swap_total: nil}), do: "swap n/a"
  defp swap(h), do: "swap #{b(h.swap_used)} of #{b(h.swap_total)} used"

  defp cgroup(nil), do: "cgroup: none limits this process"

  defp cgroup(cg) do
    limit =
      if cg.limit,
        do:
          "limit #{b(cg.limit)}, working set #{b(cg.working_set)}#{pct(cg.working_set, cg.limit)}",
        else: "no limit"

    peak = if cg.peak, do: ", peak #{b(cg.peak)}", else: ""
    "cgroup v#{cg.version} #{short(cg.path, 24)}: #{limit}; usage #{b(cg.usage)}#{peak}"
  end

  defp budget(%{background_threshold: bg, throttle_threshold: th} = d) when is_integer(bg) do
    how =
      if (d.dirty_bytes || 0) > 0 or (d.dirty_background_bytes || 0) > 0,
        do: "set in bytes",
        else:
          "#{d.dirty_background_ratio}%/#{d.dirty_ratio}% of #{b(d.dirtyable_bytes)} dirtyable"

    "dirty budget: background #{b(bg)}, throttle #{b(th)} (#{how}); " <>
      "expire #{secs(d.expire_ms)}, flush every #{secs(d.writeback_interval_ms)}"
  end

  defp budget(_), do: "dirty budget: n/a (vm.dirty_* unreadable)"

  defp io(nil), do: "I/O pressure: n/a (no /proc/pressure/io)"

  defp io(psi) do
    some = get_in(psi, [:some, :avg60])
    full = get_in(psi, [:full, :avg60])
    "I/O pressure (avg60): some #{some || "n/a"}%, full #{full || "n/a"}%"
  end

  # -- node -------------------------------------------------------------------

  defp node(n, width) do
    e = n.erlang
    other = e.system - e.ets - e.binary - e.code - e.atom

    [
      wrap(rss(n), width, "Node   "),
      wrap(
        "erlang: processes #{b(e.processes)}, ets #{b(e.ets)}, binary #{b(e.binary)}, " <>
          "code #{b(e.code)}, atom #{b(e.atom)}, other #{b(other)}; " <>
          "allocator carriers #{b(n.erlang_carriers)}",
        width
      ),
      wrap(mappings(n), width),
      wrap(heft(n.heft), width)
    ]
  end

  defp rss(%{parts: nil} = n), do: "RSS n/a; erlang #{b(n.erlang.total)}"

  defp rss(%{parts: p} = n) do
    "RSS #{b(n.rss)} = erlang #{b(p.erlang)} + allocator free #{b(p.erlang_free)} + " <>
      "files #{b(p.files)} + heft index #{b(p.heft_index)} + " <>
      "heft arenas #{b(p.heft_arenas)} + unexplained #{b(p.unexplained)}"
  end

  defp mappings(%{mappings: nil} = n), do: "swap #{b(n.swap)}; word #{n.word_size} bytes"

  defp mappings(%{mappings: m} = n) do
    "resident: anonymous #{b(m.anonymous.rss)}, files #{b(m.file.rss)}, " <>
      "heft arenas #{b(m.heft_arena.rss)}, heft indexes #{b(m.heft_index.rss)}; " <>
      "swap #{b(n.swap)}; word #{n.word_size} bytes"
  end

  defp heft(nil), do: "heft: not loaded on this node (its figures are unavailable)"

  defp heft(h) do
    "heft: #{h.tables} tables, #{b(h.memory)} (index #{b(h.index_bytes)}, arenas mapped " <>
      "#{b(h.arena_mapped_bytes)}, resident #{b(h.arena_resident_bytes)}, dirty " <>
      "#{b(h.arena_dirty_bytes)})"
  end

  # -- tables -----------------------------------------------------------------

  # kind name owner records memory resident dirty: 4+19+14+9+9+9+9 plus six
  # separating spaces is 79 columns.
  @cols [{4, :left}, {19, :left}, {14, :left}, {9, :right}, {9, :right}, {9, :right}, {9, :right}]

  defp tables(t, width, limit) do
    rows =
      Enum.map(t.ets, &{&1.bytes, :ets, &1}) ++
        Enum.map(t.heft || [], &{&1[:memory] || 0, :heft, &1})

    rows = Enum.sort_by(rows, fn {bytes, _, _} -> -bytes end)
    {shown, rest} = Enum.split(rows, limit)

    [
      "Tables, largest first (ETS: words x #{t.word_size} bytes)",
      row(["KIND", "NAME", "OWNER", "RECORDS", "MEMORY", "RESIDENT", "DIRTY"]),
      Enum.map(shown, &table_row(&1, width)),
      more(rest)
    ]
  end

  defp table_row({bytes, :ets, t}, _width) do
    kind = if t.compressed, do: "etsc", else: "ets"
    row([kind, name(t.name), owner(t), "#{t.size}", b(bytes), "", ""])
  end

  defp table_row({bytes, :heft, t}, width) do
    [
      row([
        "heft",
        name(t[:name]),
        owner(t),
        "#{t[:size]}",
        b(bytes),
        b(t[:arena_resident_bytes]),
        b(t[:arena_dirty_bytes])
      ]),
      wrap(heft_detail(t), width, "     ", "     ")
    ]
  end

  defp heft_detail(t) do
    arena =
      case t[:arena] do
        {:file, path} -> "file #{path}"
        {:file, path, memory: m} -> "memory up to #{b(m)}, then file #{path}"
        other -> "#{other}"
      end

    "arena #{arena}: mapped #{b(t[:arena_mapped_bytes])}, live #{b(t[:arena_live_bytes])}" <>
      "#{reclaimable(t)}; index #{b(t[:index_bytes])}; payload #{b(t[:payload_raw_bytes])} " <>
      "stored as #{b(t[:payload_stored_bytes])} (#{compression(t[:compression])})" <>
      table_budget(t[:budget]) <> table_expiry(t[:expiry]) <> table_tier(t[:tier])
  end

  # A tiered arena: what each tier holds, and what moved out.
  defp table_tier(nil), do: ""

  defp table_tier(tier) do
    "; in memory #{b(tier.memory_live_bytes)} live of a #{b(tier.memory_budget)} budget, " <>
      "in the file #{b(tier.file_live_bytes)}; #{tier.moved_records} records " <>
      "(#{b(tier.moved_bytes)}) moved out, #{tier.file_reads} " <>
      "(#{b(tier.file_read_bytes)}) read back"
  end

  # A table with deadlines: its time to live and what expired.
  defp table_expiry(nil), do: ""

  defp table_expiry(e) do
    ttl = if e.ttl, do: "ttl #{e.ttl} ms", else: "ttl per write"

    "; #{ttl}: #{e.expiring_keys} keys with a deadline (#{b(e.bytes)}), " <>
      "#{e.expired_keys} keys (#{e.expired_records} records) expired"
  end

  # A bounded table's budget: its use, evictions and reads.
  defp table_budget(nil), do: ""

  defp table_budget(bt) do
    bounds =
      [
        bt.max_bytes && "#{b(bt.used_bytes)} of #{b(bt.max_bytes)}",
        bt.max_records && "at most #{bt.max_records} records"
      ]
      |> Enum.filter(& &1)
      |> Enum.join(", ")

    "; budget #{bounds}: #{bt.evicted_keys} keys (#{bt.evicted_records} records) evicted, " <>
      "#{bt.hits} hits, #{bt.misses} misses"
  end

  # What a compaction would give back, and whether one runs.
  defp reclaimable(t) do
    case {t[:arena_reclaimable_bytes], t[:compaction]} do
      {nil, _} -> ""
      {r, %{state: :running}} -> ", reclaimable #{b(r)} (compacting)"
      {r, _} -> ", reclaimable #{b(r)}"
    end
  end

  defp compression({:auto, c}), do: "auto: #{compression(c)}"

  defp compression({:zstd, o}) when is_list(o),
    do: "zstd level #{o[:level]}#{if o[:dictionary] == :auto, do: " with dictionaries"}"

  defp compression({algo, level}), do: "#{algo} level #{level}"
  defp compression(other), do: "#{other}"

  defp more([]), do: []

  defp more(rest) do
    total = rest |> Enum.map(&elem(&1, 0)) |> Enum.sum()
    "  ... #{length(rest)} more tables, #{b(total)} together"
  end

  defp row(cells) do
    @cols
    |> Enum.zip(cells)
    |> Enum.map_join(" ", fn {{w, align}, cell} ->
      cell = short(cell, w)
      if align == :left, do: String.pad_trailing(cell, w), else: String.pad_leading(cell, w)
    end)
    |> String.trim_trailing()
  end

  # Elixir.Mix.State reads as Mix.State; other atoms without the colon.
  defp name(n) when is_atom(n) do
    s = Atom.to_string(n)
    if String.starts_with?(s, "Elixir."), do: inspect(n), else: s
  end

  defp name(n), do: inspect(n)

  defp owner(t) do
    case t[:owner_name] do
      nil -> t[:owner] |> inspect() |> String.replace_prefix("#PID", "")
      n -> name(n)
    end
  end

  # -- warnings ---------------------------------------------------------------

  defp warnings([], _width), do: ["Warnings: none"]

  defp warnings(ws, width) do
    [
      "Warnings",
      for {sev, code, msg} <- ws do
        tag = sev |> Atom.to_string() |> String.upcase() |> String.pad_trailing(8)
        wrap("#{code}: #{msg}", width, "  " <> tag, String.duplicate(" ", 10))
      end
    ]
  end

  # -- text helpers -----------------------------------------------------------

  @indent "       "

  # Greedy word wrap: the first line starts with `first`, the rest with
  # `indent`; a word longer than a line is cut by fit/2.
  defp wrap(text, width, first \\ @indent, indent \\ @indent) do
    {lines, current} =
      text
      |> String.split(" ", trim: true)
      |> glue_units()
      |> Enum.reduce({[], first}, fn word, {lines, line} ->
        cond do
          line in [first, indent] -> {lines, line <> word}
          String.length(line) + 1 + String.length(word) <= width -> {lines, line <> " " <> word}
          true -> {[line | lines], indent <> word}
        end
      end)

    Enum.reverse([current | lines])
  end

  # "423" "MiB," -> "423 MiB,": a figure and its unit stay on one line.
  defp glue_units([n, unit | rest]) do
    if Regex.match?(~r/^(B|KiB|MiB|GiB|TiB|PiB|s)[,;:)]*$/, unit),
      do: glue_units([n <> " " <> unit | rest]),
      else: [n | glue_units([unit | rest])]
  end

  defp glue_units(words), do: words

  defp fit(line, width) do
    if String.length(line) <= width, do: line, else: String.slice(line, 0, width - 2) <> ".."
  end

  defp short(s, w) do
    if String.length(s) <= w, do: s, else: String.slice(s, 0, w - 2) <> ".."
  end

  defp b(n), do: Units.format(n)

  defp pct(_part, whole) when whole in [nil, 0], do: ""
  defp pct(nil, _whole), do: ""
  defp pct(part, whole), do: " (#{round(part * 100 / whole)}%)"

  defp secs(nil), do: "n/a"
  defp secs(ms) when rem(ms, 1000) == 0, do: "#{div(ms, 1000)} s"
  defp secs(ms), do: "#{ms / 1000} s"
end
