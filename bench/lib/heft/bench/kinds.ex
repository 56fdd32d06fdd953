defmodule Heft.Bench.Kinds do
  # The four record kinds of the benchmark (issue 5). Every record is
  # `{i, value}` with an integer key `i`; records are generated in chunks just
  # before they are inserted, outside the timed part, so that only one chunk
  # at a time lives on the benchmark process's heap.
  @moduledoc false

  @kinds [:small_map, :tuple100, :random_1k, :json_1k]

  # Words for the JSON-like record; picked by a hash of the key so that
  # records differ but compress the way real JSON does.
  @words ~w(login logout view click search purchase refund share comment like
            upload download open close save delete create update archive restore)

  def all, do: @kinds

  def describe(:small_map), do: ~S|small map `{i, %{id: i, name: "user-#{i}", age: rem(i, 90)}}`|

  def describe(:tuple100),
    do:
      "100-tuple `{i, List.to_tuple(for _ <- 1..100, do: List.duplicate(:a, 10))}` (elements unshared)"

  def describe(:random_1k),
    do: "1 KB random binary (incompressible) `{i, :crypto.strong_rand_bytes(1024)}`"

  def describe(:json_1k), do: "1 KB JSON-like binary (compressible) `{i, ~s({\"id\":i,...})}`"

  # Short names for plot titles.
  def label(:small_map), do: "small map record"
  def label(:tuple100), do: "100-tuple record"
  def label(:random_1k), do: "1 KB random binary"
  def label(:json_1k), do: "1 KB JSON-like binary"

  def record(:small_map, i), do: {i, %{id: i, name: "user-#{i}", age: rem(i, 90)}}
  # 100 lists built one by one: no element shares another's cells.
  # (`:erlang.make_tuple(100, list)` would put one list in all 100, which
  # Heft stores once and ETS copies 100 times: a lookup ratio that
  # flatters Heft.)
  def record(:tuple100, i), do: {i, List.to_tuple(ten_atoms(100, []))}
  def record(:random_1k, i), do: {i, crypto().strong_rand_bytes(1024)}
  def record(:json_1k, i), do: {i, json(i)}

  defp ten_atoms(0, acc), do: acc
  defp ten_atoms(n, acc), do: ten_atoms(n - 1, [:lists.duplicate(10, :a) | acc])

  # :crypto (four times faster than :rand.bytes/1) is called through a
  # function so that the library need not declare :crypto as an application
  # just for the bench (mix.exs is not the bench's to change).
  defp crypto, do: :crypto

  # Records first..last (inclusive), in key order.
  def chunk(kind, first, last), do: for(i <- first..last//1, do: record(kind, i))

  # True when `record(kind, i)` gives the same value every time, so a lookup
  # can be checked against it (the random binary cannot).
  def deterministic?(kind), do: kind != :random_1k

  # A user record with an event log and a note: valid JSON of exactly 1,024
  # bytes. Events come from a pre-rendered pool (generating each from scratch
  # cost 27 µs a record, more than some stores take to insert it); each record
  # starts at its own place in the pool, stamps its own times, and ends with
  # a note cut to fill the rest.
  @pool_size 256
  @events (for j <- 0..(@pool_size - 1) do
             word = Enum.at(@words, :erlang.phash2(j, length(@words)))
             open = ~s({"type":"#{word}","at":)
             close = ~s(,"ok":#{rem(j, 7) != 0}})
             # ",", open, a 10-digit time, close
             {open, close, 1 + byte_size(open) + 10 + byte_size(close)}
           end)
          |> List.to_tuple()
  @note Enum.map_join(0..400, " ", &Enum.at(@words, :erlang.phash2({:note, &1}, length(@words))))
  @note_open ~s(],"note":")
  @close ~s("}\n)
  # Room kept for the note: at least this many bytes of it.
  @min_note 40

  def json(i) do
    head =
      ~s({"id":#{i},"name":"user-#{i}","email":"user-#{i}@example.com","age":#{rem(i, 90)},) <>
        ~s("active":#{rem(i, 3) != 0},"address":{"street":"#{rem(i, 997)} Main Street",) <>
        ~s("city":"Springfield","zip":"#{10_000 + rem(i, 89_999)}"},"events":[)

    room = 1024 - byte_size(@note_open) - byte_size(@close) - @min_note
    {events, size} = events(i, rem(i * 37, @pool_size), 0, byte_size(head), room, [])

    note =
      binary_part(
        @note,
        rem(i * 13, 1000),
        1024 - size - byte_size(@note_open) - byte_size(@close)
      )

    IO.iodata_to_binary([head, events, @note_open, note, @close])
  end

  defp drop_comma([[_comma | event] | rest]), do: [event | rest]

  defp events(i, at, n, size, room, acc) do
    {open, close, length} = elem(@events, rem(at + n, @pool_size))
    event = [",", open, Integer.to_string(1_700_000_000 + i * 40 + n), close]
    grown = size + length

    if grown > room or n == 40,
      do: {drop_comma(Enum.reverse(acc)), size - 1},
      else: events(i, at, n + 1, grown, room, [event | acc])
  end
end
