# A node holding loaded Heft and ETS tables, for the README's capture of
# `mix heft.report --node`:
#
#     elixir --sname heftapp --cookie heftdemo -S mix run bench/report_node.exs
#     mix heft.report --node heftapp --cookie heftdemo    # from another shell
users = Heft.new(:users, [:named_table, :public])

for c <- Enum.chunk_every(1..1_000_000, 10_000) do
  Heft.insert(users, Enum.map(c, &{&1, %{id: &1, name: "user-#{&1}", age: rem(&1, 90)}}))
end

wide = Heft.new(:wide_records, [:named_table, :public, :ordered_set])

for c <- Enum.chunk_every(1..200_000, 5_000) do
  Heft.insert(wide, Enum.map(c, &{&1, :erlang.make_tuple(100, List.duplicate(:a, 10))}))
end

sessions = :ets.new(:sessions, [:named_table, :public])

for c <- Enum.chunk_every(1..1_000_000, 10_000) do
  :ets.insert(sessions, Enum.map(c, &{&1, %{id: &1, name: "user-#{&1}", age: rem(&1, 90)}}))
end

wide_ets = :ets.new(:wide_ets, [:named_table, :public])
:ets.insert(wide_ets, Enum.map(1..20_000, &{&1, :erlang.make_tuple(100, List.duplicate(:a, 10))}))
IO.puts("loaded")
Process.sleep(:infinity)
