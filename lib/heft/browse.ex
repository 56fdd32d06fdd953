defmodule Heft.Browse do
  # Heft.i/1 (documented in lib/heft.ex): :ets.i/1's pager, over a Heft
  # table. It shows the objects (key by key, in walk order) 40 lines a
  # page, each numbered and cut to 80 columns, and reads a command after
  # each page and at the end: c (or an empty line) continues, q quits,
  # k deletes the table, pN prints the N-th object (of those shown, from
  # the start) in full, /regex shows only the objects whose text matches,
  # from the start. End of input quits.
  @moduledoc false

  @height 40
  @width 80
  @more "(c)ontinue (q)uit (p)Digits (k)ill /Regexp -->"
  @eot "EOT  (q)uit (p)Digits (k)ill /Regexp -->"

  @spec i(Heft.tab()) :: :ok
  def i(tab), do: display(tab, Heft.first(tab), 1, 1, nil)

  # `turn`: lines shown on this page so far, plus one; `pos`: the number of
  # the next object shown; `re`: the filter, or nil for every object.
  defp display(tab, :"$end_of_table", _turn, pos, re),
    do: choose(tab, @eot, :eot, re, :"$end_of_table", pos)

  defp display(tab, key, turn, pos, re) when turn >= @height,
    do: choose(tab, @more, :more, re, key, pos)

  defp display(tab, key, turn, pos, re) do
    objects = tab |> Heft.lookup(key) |> matching(re)
    for {object, n} <- Enum.with_index(objects, pos), do: IO.puts(line(object, n))
    shown = length(objects)
    display(tab, Heft.next(tab, key), turn + shown, pos + shown, re)
  end

  defp choose(tab, prompt, mode, re, key, pos) do
    case read(prompt) do
      "c" when mode == :more ->
        display(tab, key, 1, pos, re)

      "q" ->
        :ok

      "k" ->
        _ = Heft.delete(tab)
        :ok

      "p" <> digits ->
        print_nth(tab, digits, re)
        choose(tab, prompt, mode, re, key, pos)

      "/" <> source ->
        case Regex.compile(source, "u") do
          {:ok, re} ->
            display(tab, Heft.first(tab), 1, 1, re)

          {:error, {message, _at}} ->
            IO.puts(to_string(message))
            choose(tab, prompt, mode, re, key, pos)
        end

      :eof ->
        :ok

      _ ->
        choose(tab, prompt, mode, re, key, pos)
    end
  end

  # The command typed, without its newline ("c" for an empty line).
  defp read(prompt) do
    case IO.gets(prompt) do
      line when is_binary(line) ->
        case String.trim_trailing(line, "\n") do
          "" -> "c"
          command -> command
        end

      _eof_or_error ->
        :eof
    end
  end

  defp print_nth(tab, digits, re) do
    case Integer.parse(String.trim(digits)) do
      {n, ""} when n >= 1 ->
        case tab |> objects(re) |> Enum.at(n - 1) do
          nil -> :ok
          object -> IO.puts(inspect(object, pretty: true, limit: :infinity))
        end

      _ ->
        IO.puts("Bad digits")
    end
  end

  # The objects shown with filter `re`, in order, lazily.
  defp objects(tab, re) do
    Heft.first(tab)
    |> Stream.unfold(fn
      :"$end_of_table" -> nil
      key -> {tab |> Heft.lookup(key) |> matching(re), Heft.next(tab, key)}
    end)
    |> Stream.concat()
  end

  defp matching(objects, nil), do: objects
  defp matching(objects, re), do: Enum.filter(objects, &Regex.match?(re, text(&1)))

  defp line(object, n) do
    text = text(object)

    text =
      if String.length(text) > @width - 8,
        do: String.slice(text, 0, @width - 13) <> "  ...",
        else: text

    "<" <> String.pad_trailing(Integer.to_string(n), 4) <> "> " <> text
  end

  defp text(object), do: inspect(object, limit: :infinity, printable_limit: :infinity)
end
