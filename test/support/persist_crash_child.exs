# Run by test/heft/persist_crash_test.exs as a separate OS process, which
# the test kills with SIGKILL at a random moment:
#
#     elixir -pa <heft ebin> persist_crash_child.exs DIR FIRST_BATCH
#
# Four writers insert batches into a `sync: :commit` table with a tiny dump
# threshold (so kills often land during dumps) and print `ack B` once batch
# B is acknowledged, and `ctr N` once a counter update returned N. Batch B
# holds `{{:count, B}, n}` and `{{:b, B, j}, value}` for j in 1..n, so a
# half-applied batch shows as a count without all its records.
[dir, first] = System.argv()
first = String.to_integer(first)

tab =
  case Heft.open(dir) do
    {:ok, tab} ->
      tab

    {:error, :enoent} ->
      Heft.new(:crash, [:public, persist: dir, sync: :commit, dump_log_write_threshold: 300])
  end

IO.puts("ready")

for w <- 0..3 do
  spawn_link(fn ->
    Stream.iterate(first + w, &(&1 + 4))
    |> Enum.each(fn b ->
      n = rem(b * 7, 13) + 1
      recs = [{{:count, b}, n} | for(j <- 1..n, do: {{:b, b, j}, :binary.copy("v", rem(b, 300))})]
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
