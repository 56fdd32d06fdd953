# Run by test/heft/persist_crash_test.exs as a separate OS process, which
# the test kills with SIGKILL at a random moment:
#
#     elixir -pa <heft ebin> persist_crash_child.exs DIR FIRST_BATCH [SYNC [train]]
#
# Four writers insert batches into a table (created `sync: :commit`, or
# `sync: :none` when SYNC is "none") with a tiny dump threshold (so kills
# often land during dumps) and print `ack B` once batch B is acknowledged,
# and `ctr N` once a counter update returned N. A kill of the VM loses no
# acknowledged write in either mode: a `:none` write is in the page cache
# (the log's mapping) when the call returns. Batch B
# holds `{{:count, B}, n}` and `{{:b, B, j}, value}` for j in 1..n, so a
# half-applied batch shows as a count without all its records.
#
# With "big", one writer inserts batches of 40 records of 1 MB (a 40 MB
# log frame, which no segment holding an earlier one has room for, so
# nearly every batch moves the log to a new segment) into a table with
# `compression: :none`: kills land while segments are sealed and the next
# one written. Batch B holds `{{:big, j}, B, bytes}` for j in 1..40 and
# `{:big_count, B}`, overwriting the batch before, and prints `big B`.
#
# With "train", the table is `compression: {:zstd, dictionary: :auto}` and
# a fifth process trains a dictionary again and again (each training
# re-compresses the older records in the background), so kills land
# while dictionaries are made, logged, snapshotted and used.
#
# With "compact", a fifth process inserts 200 records of 2 KB and deletes
# them again, over and over, and compacts the table after each round
# (printing `moved N`, the records it moved), so kills land while records
# move in the working copy that dumps read.
# A record's value: what persist_crash_test.exs checks it reads back as
# (JSON-like, so that a dictionary beats zstd alone on it).
value = fn b ->
  ~s({"user":"user-#{b}","mail":"user#{b}@example.com","pad":") <>
    :binary.copy("v", rem(b, 300)) <> ~s("})
end

import Bitwise

[dir, first | rest] = System.argv()
first = String.to_integer(first)
sync = if List.first(rest) == "none", do: :none, else: :commit
train = "train" in rest
compact = "compact" in rest
big = "big" in rest

compression =
  cond do
    train -> [compression: {:zstd, dictionary: :auto}]
    big -> [compression: :none]
    true -> []
  end

tab =
  case Heft.open(dir) do
    {:ok, tab} ->
      tab

    {:error, :enoent} ->
      Heft.new(
        :crash,
        [:public, persist: dir, sync: sync, dump_log_write_threshold: 300] ++ compression
      )
  end

if train do
  spawn_link(fn ->
    Stream.repeatedly(fn -> Heft.train_dictionary(tab, samples: 64, dictionary_bytes: 1024) end)
    |> Enum.each(fn
      {:ok, _id} -> Process.sleep(20)
      {:error, _} -> Process.sleep(5)
    end)
  end)
end

if compact do
  spawn_link(fn ->
    junk = :binary.copy("j", 2000)

    Stream.iterate(0, &(&1 + 1))
    |> Enum.each(fn i ->
      true = Heft.insert(tab, for(j <- 1..200, do: {{:junk, j}, i, junk}))
      200 = Heft.select_delete(tab, [{{{:junk, :_}, :_, :_}, [], [true]}])
      {:ok, %{moved_records: moved}} = Heft.compact(tab)
      IO.puts("moved #{moved}")
    end)
  end)
end

IO.puts("ready")

if big do
  bytes = :crypto.strong_rand_bytes(1 <<< 20)

  Stream.iterate(first, &(&1 + 1))
  |> Enum.each(fn b ->
    recs = [{:big_count, b} | for(j <- 1..40, do: {{:big, j}, b, bytes})]
    true = Heft.insert(tab, recs)
    IO.puts("big #{b}")
  end)
end

for w <- 0..3 do
  spawn_link(fn ->
    Stream.iterate(first + w, &(&1 + 4))
    |> Enum.each(fn b ->
      n = rem(b * 7, 13) + 1
      recs = [{{:count, b}, n} | for(j <- 1..n, do: {{:b, b, j}, value.(b)})]
      true = Heft.insert(tab, recs)
      IO.puts("ack #{b}")

      if rem(b, 5) == 0 do
        c = Heft.update_counter(tab, :total, {2, 1}, {:total, 0})
        IO.puts("ctr #{c}")
      end
    end)
  end)
end

Process.sleep(:infinity)
