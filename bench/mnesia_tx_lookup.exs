# Reproduces a slowdown found with bench/mnesia.exs: on a heft_copies
# table, lookups get several times slower after Mnesia transactions
# have overwritten records, and stay slower; dirty writes and Heft's own
# inserts of the same records do not do it. Prints µs per operation and
# the table's arena_free_bytes and meta_bytes after each step.
#
#     mix run bench/mnesia_tx_lookup.exs
dir = Path.join(System.tmp_dir!(), "heft-mnesia-tx-lookup")
File.rm_rf!(dir)
File.mkdir_p!(dir)
:ok = :application.load(:mnesia)
:ok = :application.set_env(:mnesia, :dir, String.to_charlist(dir))
:logger.set_primary_config(:level, :error)
:ok = :mnesia.create_schema([node()], backend_types: [heft_copies: :heft_mnesia])
:ok = :mnesia.start()
{:atomic, :ok} = :mnesia.create_table(:t, heft_copies: [node()], attributes: [:k, :v])
rec = fn i -> {:t, i, :erlang.make_tuple(100, List.duplicate(:a, 10))} end
n = 100_000
for i <- 1..n, do: :ok = :mnesia.dirty_write(rec.(i))
h = :persistent_term.get({:heft_mnesia, :heft_copies, :t})
keys = for _ <- 1..2000, do: :rand.uniform(n)

step = fn label, f ->
  {us, _} = :timer.tc(fn -> Enum.each(keys, f) end)

  IO.puts(
    "#{label}: #{Float.round(us / 2000, 2)} µs; arena_free_bytes " <>
      "#{Heft.info(h, :arena_free_bytes)}, meta_bytes #{Heft.info(h, :meta_bytes)}"
  )
end

lookup = &Heft.lookup(h, &1)
step.("Heft.lookup", lookup)
step.("mnesia:dirty_write overwrites", &:mnesia.dirty_write(rec.(&1)))
step.("Heft.lookup", lookup)
step.("Heft.insert overwrites", &Heft.insert(h, rec.(&1)))
step.("Heft.lookup", lookup)

step.("mnesia:transaction write overwrites", fn k ->
  {:atomic, :ok} = :mnesia.transaction(fn -> :mnesia.write(rec.(k)) end)
end)

step.("Heft.lookup", lookup)
Process.sleep(5000)
step.("Heft.lookup 5 s later", lookup)

# The same on a plain persistent Heft table: delete then insert.
p = Heft.new(:plain, [:public, {:keypos, 2}, {:persist, Path.join(dir, "plain")}])
for c <- Enum.chunk_every(1..n, 1000), do: Heft.insert(p, Enum.map(c, rec))

plain = fn label, f ->
  {us, _} = :timer.tc(fn -> Enum.each(keys, f) end)

  IO.puts(
    "plain table, #{label}: #{Float.round(us / 2000, 2)} µs; arena_free_bytes #{Heft.info(p, :arena_free_bytes)}"
  )
end

plain.("Heft.lookup", &Heft.lookup(p, &1))
plain.("Heft.delete then Heft.insert", fn k -> Heft.delete(p, k) && Heft.insert(p, rec.(k)) end)
plain.("Heft.lookup", &Heft.lookup(p, &1))

:stopped = :mnesia.stop()
File.rm_rf!(dir)
