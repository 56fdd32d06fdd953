defmodule Heft.Bench.Plot do
  # A small SVG line-plot writer with log scales on both axes: decade ticks
  # with labels and light minor grid lines (2..9 × each decade), axis
  # titles, a title and subtitle, a legend with one colour and marker per
  # store, min–max error bars, and notes under the plot.
  #
  # Input: %{title, subtitle, x_title, y_title, notes: [String],
  #          series: [%{name, style, dashed, legend, points: [{x, y, lo, hi}]}]}
  # where `style` indexes the palette and markers (one per store, the same in
  # every plot), `dashed` draws the line dashed with hollow markers, and
  # `legend: false` leaves the series out of the legend (a dashed variant of a
  # store already listed).
  @moduledoc false

  @width 920
  @left 82
  @right 200
  @top 72
  @plot_height 400
  @bottom 64
  @note_line 16

  @colors ~w(#0072B2 #56B4E9 #E69F00 #8C564B #D55E00 #009E73 #CC79A7 #7F7F7F #000000 #9467BD
             #BCBD22 #17BECF #F0027F)
  @markers [
    :circle,
    :square,
    :triangle,
    :diamond,
    :triangle_down,
    :cross,
    :plus,
    :pentagon,
    :hexagon,
    :star
  ]

  def svg(plot) do
    notes = Enum.flat_map(plot.notes, &wrap(&1, 120))
    height = @top + @plot_height + @bottom + @note_line * length(notes) + 10
    pw = @width - @left - @right
    points = Enum.flat_map(plot.series, & &1.points)
    {x0, x1} = x_range(points)
    {y0, y1} = y_range(points)
    sx = fn x -> @left + (:math.log10(x) - x0) / (x1 - x0) * pw end
    sy = fn y -> @top + @plot_height - (:math.log10(y) - y0) / (y1 - y0) * @plot_height end

    body = [
      ~s(<rect width="100%" height="100%" fill="white"/>),
      text(@left, 28, plot.title, size: 19, weight: "bold"),
      text(@left, 50, plot.subtitle, size: 13, fill: "#555"),
      grid(:x, x0, x1, sx),
      grid(:y, y0, y1, sy),
      ~s(<rect x="#{@left}" y="#{@top}" width="#{pw}" height="#{@plot_height}" fill="none" stroke="#333"/>),
      text(@left + pw / 2, @top + @plot_height + 44, plot.x_title, size: 14, anchor: "middle"),
      text(22, @top + @plot_height / 2, plot.y_title,
        size: 14,
        anchor: "middle",
        transform: "rotate(-90 22 #{@top + @plot_height / 2})"
      ),
      Enum.map(plot.series, &series(&1, sx, sy)),
      legend(plot.series, @left + pw + 18),
      notes
      |> Enum.with_index()
      |> Enum.map(fn {note, i} ->
        text(@left, @top + @plot_height + @bottom + i * @note_line, note, size: 12, fill: "#555")
      end)
    ]

    IO.iodata_to_binary([
      ~s(<?xml version="1.0" encoding="UTF-8"?>\n),
      ~s(<svg xmlns="http://www.w3.org/2000/svg" width="#{@width}" height="#{height}" ),
      ~s(viewBox="0 0 #{@width} #{height}" font-family="Helvetica, Arial, sans-serif">\n),
      body |> List.flatten() |> Enum.intersperse("\n"),
      "\n</svg>\n"
    ])
  end

  # Record counts: a little room either side of the outer points.
  defp x_range([]), do: {3.0, 6.0}

  defp x_range(points) do
    xs = Enum.map(points, &:math.log10(elem(&1, 0)))
    {lo, hi} = Enum.min_max(xs)
    if hi - lo < 0.5, do: {lo - 0.5, hi + 0.5}, else: {lo - 0.15, hi + 0.15}
  end

  # Values: whole decades around everything drawn, error bars included.
  defp y_range([]), do: {0.0, 1.0}

  defp y_range(points) do
    ys = Enum.flat_map(points, fn {_, y, lo, hi} -> [y, lo, hi] end) |> Enum.filter(&(&1 > 0))
    {lo, hi} = Enum.min_max(ys)
    lo = Float.floor(:math.log10(lo))
    hi = Float.ceil(:math.log10(hi))
    if hi <= lo, do: {lo, lo + 1}, else: {lo, hi}
  end

  # Major lines and labels at decades; minor lines at 2..9 × a decade,
  # labelled at 2 and 5 when the axis spans two decades or fewer.
  defp grid(axis, lo, hi, scale) do
    label_minor = hi - lo <= 2.01

    for d <- floor(lo)..ceil(hi),
        m <- 1..9,
        value = m * :math.pow(10, d),
        log = :math.log10(value),
        log >= lo - 1.0e-9,
        log <= hi + 1.0e-9 do
      pos = scale.(value)
      major = m == 1
      color = if major, do: "#d0d0d0", else: "#eeeeee"
      labelled = major or (label_minor and m in [2, 5])

      line =
        case axis do
          :x ->
            ~s(<line x1="#{f(pos)}" y1="#{@top}" x2="#{f(pos)}" y2="#{@top + @plot_height}" stroke="#{color}"/>)

          :y ->
            ~s(<line x1="#{@left}" y1="#{f(pos)}" x2="#{@width - @right}" y2="#{f(pos)}" stroke="#{color}"/>)
        end

      label =
        cond do
          not labelled ->
            []

          axis == :x ->
            text(pos, @top + @plot_height + 20, tick(value), size: 13, anchor: "middle")

          true ->
            text(@left - 8, pos + 4, tick(value), size: 13, anchor: "end")
        end

      [line, label]
    end
  end

  defp series(s, sx, sy) do
    color = Enum.at(@colors, rem(s.style || 0, length(@colors)))
    marker = Enum.at(@markers, rem(s.style || 0, length(@markers)))
    pts = Enum.sort(s.points)
    path = Enum.map_join(pts, " ", fn {x, y, _, _} -> "#{f(sx.(x))},#{f(sy.(y))}" end)
    dash = if s.dashed, do: ~s( stroke-dasharray="7 5"), else: ""

    [
      ~s(<polyline points="#{path}" fill="none" stroke="#{color}" stroke-width="2"#{dash}/>),
      for {x, y, lo, hi} <- pts do
        bar =
          if lo < hi do
            {px, a, b} = {sx.(x), sy.(lo), sy.(hi)}

            [
              ~s(<line x1="#{f(px)}" y1="#{f(a)}" x2="#{f(px)}" y2="#{f(b)}" stroke="#{color}" stroke-width="1.5"/>),
              ~s(<line x1="#{f(px - 4)}" y1="#{f(a)}" x2="#{f(px + 4)}" y2="#{f(a)}" stroke="#{color}" stroke-width="1.5"/>),
              ~s(<line x1="#{f(px - 4)}" y1="#{f(b)}" x2="#{f(px + 4)}" y2="#{f(b)}" stroke="#{color}" stroke-width="1.5"/>)
            ]
          else
            []
          end

        [bar, marker(marker, sx.(x), sy.(y), color, s.dashed)]
      end
    ]
  end

  defp legend(series, x) do
    series
    |> Enum.filter(& &1.legend)
    |> Enum.with_index()
    |> Enum.map(fn {s, i} ->
      y = @top + 12 + i * 24
      color = Enum.at(@colors, rem(s.style || 0, length(@colors)))
      marker = Enum.at(@markers, rem(s.style || 0, length(@markers)))

      [
        ~s(<line x1="#{x}" y1="#{y}" x2="#{x + 30}" y2="#{y}" stroke="#{color}" stroke-width="2"/>),
        marker(marker, x + 15, y, color, false),
        text(x + 40, y + 5, s.name, size: 13)
      ]
    end)
  end

  # Markers of radius ~5 centred on (x, y); hollow ones for dashed series.
  defp marker(shape, x, y, color, hollow) do
    fill = if hollow, do: "white", else: color
    style = ~s(fill="#{fill}" stroke="#{color}" stroke-width="1.5")

    case shape do
      :circle -> ~s(<circle cx="#{f(x)}" cy="#{f(y)}" r="4.5" #{style}/>)
      :square -> ~s(<rect x="#{f(x - 4)}" y="#{f(y - 4)}" width="8" height="8" #{style}/>)
      :cross -> cross(x, y, color, 45)
      :plus -> cross(x, y, color, 0)
      :triangle -> polygon(x, y, 3, -90, 5.5, style)
      :triangle_down -> polygon(x, y, 3, 90, 5.5, style)
      :diamond -> polygon(x, y, 4, 0, 5.5, style)
      :pentagon -> polygon(x, y, 5, -90, 5.2, style)
      :hexagon -> polygon(x, y, 6, 0, 5.0, style)
      :star -> star(x, y, style)
    end
  end

  defp polygon(x, y, n, start_deg, r, style) do
    pts =
      for k <- 0..(n - 1) do
        a = (start_deg + k * 360 / n) * :math.pi() / 180
        "#{f(x + r * :math.cos(a))},#{f(y + r * :math.sin(a))}"
      end

    ~s(<polygon points="#{Enum.join(pts, " ")}" #{style}/>)
  end

  defp star(x, y, style) do
    pts =
      for k <- 0..9 do
        r = if rem(k, 2) == 0, do: 6.0, else: 2.6
        a = (-90 + k * 36) * :math.pi() / 180
        "#{f(x + r * :math.cos(a))},#{f(y + r * :math.sin(a))}"
      end

    ~s(<polygon points="#{Enum.join(pts, " ")}" #{style}/>)
  end

  defp cross(x, y, color, deg) do
    ~s|<g transform="rotate(#{deg} #{f(x)} #{f(y)})" stroke="#{color}" stroke-width="2.2">| <>
      ~s(<line x1="#{f(x - 5)}" y1="#{f(y)}" x2="#{f(x + 5)}" y2="#{f(y)}"/>) <>
      ~s(<line x1="#{f(x)}" y1="#{f(y - 5)}" x2="#{f(x)}" y2="#{f(y + 5)}"/></g>)
  end

  defp text(x, y, content, opts) do
    attrs = [
      {"font-size", opts[:size]},
      {"font-weight", opts[:weight]},
      {"fill", opts[:fill] || "#222"},
      {"text-anchor", opts[:anchor]},
      {"transform", opts[:transform]}
    ]

    attrs = for {k, v} <- attrs, v != nil, do: ~s( #{k}="#{v}")
    ~s(<text x="#{f(x)}" y="#{f(y)}"#{attrs}>#{escape(content)}</text>)
  end

  # Tick labels: 0.01, 0.5, 2, 100, 2k, 10k, 1M.
  def tick(v) when v >= 1.0e6, do: trim(v / 1.0e6) <> "M"
  def tick(v) when v >= 1.0e3, do: trim(v / 1.0e3) <> "k"
  def tick(v), do: trim(v)

  defp trim(v) do
    r = Float.round(v / 1, 6)

    if r == Float.round(r),
      do: Integer.to_string(round(r)),
      else: r |> Float.to_string() |> String.trim_trailing("0")
  end

  defp wrap(text, width) do
    text
    |> String.split(" ")
    |> Enum.reduce([], fn
      word, [line | rest] when byte_size(line) + byte_size(word) < width ->
        [line <> " " <> word | rest]

      word, lines ->
        [word | lines]
    end)
    |> Enum.reverse()
  end

  defp escape(text) do
    text
    |> to_string()
    |> String.replace("&", "&amp;")
    |> String.replace("<", "&lt;")
    |> String.replace(">", "&gt;")
  end

  defp f(x), do: :erlang.float_to_binary(x / 1, decimals: 1)
end
