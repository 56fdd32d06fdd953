# Three Mnesia nodes on this machine sharing a replicated, indexed
# ordered_set `heft_copies` table; one is killed with SIGKILL while the
# others write and delete, then restarted: it reloads and ends equal.
# Run through bin/mnesia-demo (starts epmd); options: --count N (records
# written first, 200,000).
#
# Each node is a child VM (`:peer`, driven over its standard I/O, so they
# all halt when this VM ends, even if it is killed) with its own Mnesia
# directory under a temporary directory, which is removed at the end.

{:module, _, node_bin, _} =
  defmodule MnesiaDemo.Node do
    # Runs in each node.
    def setup(dir) do
      File.mkdir_p!(dir)
      :ok = :logger.set_primary_config(:level, :error)

      :ok =
        :application.load(:mnesia)
        |> then(&if(&1 == {:error, {:already_loaded, :mnesia}}, do: :ok, else: &1))

      :ok = :application.set_env(:mnesia, :dir, String.to_charlist(dir))
      :application.set_env(:mnesia, :core_dir, String.to_charlist(dir))
    end

    def os_pid, do: String.to_integer(System.pid())

    def write(from, to, tag_fun) do
      for c <- Enum.chunk_every(from..to, 1_000) do
        {:atomic, :ok} =
          :mnesia.transaction(fn ->
            Enum.each(c, &:mnesia.write({:demo, &1, tag_fun.(&1), "v#{&1}"}))
          end)
      end

      :ok
    end

    def tag(i), do: rem(i, 10)
    def moved(_), do: :moved

    def delete(keys) do
      for c <- Enum.chunk_every(keys, 1_000) do
        {:atomic, :ok} = :mnesia.transaction(fn -> Enum.each(c, &:mnesia.delete({:demo, &1})) end)
      end

      :ok
    end

    # Time from mnesia:start/0 until the table is loaded, in ms.
    def start_and_wait do
      t0 = System.monotonic_time(:microsecond)
      :ok = :mnesia.start()
      :ok = :mnesia.wait_for_tables([:demo], 300_000)
      (System.monotonic_time(:microsecond) - t0) / 1000
    end

    # What this node's replica holds: size, a checksum of its sorted
    # records, and what the tag index answers for each tag.
    def summary do
      recs = :mnesia.dirty_select(:demo, [{:_, [], [:"$_"]}])
      true = recs == Enum.sort(recs)

      index =
        for tag <- Enum.to_list(0..9) ++ [:moved], into: %{} do
          {tag,
           :mnesia.dirty_index_read(:demo, tag, :tag) |> Enum.map(&elem(&1, 1)) |> Enum.sort()}
        end

      %{
        size: :mnesia.table_info(:demo, :size),
        records: length(recs),
        checksum: :erlang.phash2(recs),
        index_checksum: :erlang.phash2(index),
        index_moved: length(index[:moved]),
        index_3: length(index[3]),
        storage: :mnesia.table_info(:demo, :storage_type),
        first: :mnesia.dirty_first(:demo),
        last: :mnesia.dirty_last(:demo)
      }
    end
  end

defmodule MnesiaDemo do
  @backends [heft_copies: :heft_mnesia, heft_ram_copies: :heft_mnesia]

  def main(argv, node_bin) do
    {opts, _, _} = OptionParser.parse(argv, strict: [count: :integer])
    n = opts[:count] || 200_000
    u = System.unique_integer([:positive])
    root = Path.join(System.tmp_dir!(), "heft-mnesia-demo-#{u}")
    cookie = ~c"heftdemo#{u}"
    names = for x <- ~w(a b c), do: :"heftdemo_#{x}_#{u}"
    dirs = Map.new(names, &{&1, Path.join(root, Atom.to_string(&1))})
    Process.put(:vms, [])
    t_start = System.monotonic_time(:millisecond)

    try do
      say("3 nodes, Mnesia directories under #{root}")
      vms = for name <- names, into: %{}, do: {name, child(name, cookie, node_bin, dirs[name])}
      nodes = for name <- names, do: call(vms[name], :erlang, :node, [])
      [na, nb, nc] = nodes
      [a, b, c] = Enum.map(names, &vms[&1])
      for x <- [nb, nc], do: true = call(a, :net_kernel, :connect_node, [x])
      :ok = call(a, :mnesia, :create_schema, [nodes, [backend_types: @backends]])
      for vm <- [a, b, c], do: :ok = call(vm, :mnesia, :start, [])

      {:atomic, :ok} =
        call(a, :mnesia, :create_table, [
          :demo,
          [heft_copies: nodes, type: :ordered_set, attributes: [:k, :tag, :v], index: [:tag]]
        ])

      say("table demo: ordered_set, heft_copies on #{inspect(nodes)}, index on tag")
      {us, :ok} = :timer.tc(fn -> node_call(a, :write, [1, n, &MnesiaDemo.Node.tag/1]) end)
      say("wrote #{n} records from #{na} (transactions of 1,000) in #{ms(us / 1000)}")
      show("replicas after the writes", [{na, a}, {nb, b}, {nc, c}])

      os_pid = node_call(c, :os_pid, [])
      ref = Process.monitor(c)
      {_, 0} = System.cmd("kill", ["-9", Integer.to_string(os_pid)])
      receive do: ({:DOWN, ^ref, _, _, _} -> :ok), after: (10_000 -> raise "#{nc} did not die")
      Process.put(:vms, Process.get(:vms) -- [c])
      say("killed #{nc} (OS pid #{os_pid}) with SIGKILL")

      half = div(n, 2)
      :ok = node_call(a, :write, [n + 1, n + div(n, 5), &MnesiaDemo.Node.tag/1])
      :ok = node_call(b, :delete, [Enum.to_list(1..div(n, 10))])
      :ok = node_call(a, :write, [half + 1, half + div(n, 10), &MnesiaDemo.Node.moved/1])
      :ok = call(b, :mnesia, :dirty_delete, [:demo, n])

      say(
        "while it was down: #{na} wrote #{div(n, 5)} new records, #{nb} deleted keys 1..#{div(n, 10)} " <>
          "and the key #{n}, #{na} moved #{div(n, 10)} records to tag :moved"
      )

      show("the two running replicas", [{na, a}, {nb, b}])

      c = child(Enum.at(names, 2), cookie, node_bin, dirs[Enum.at(names, 2)])
      true = call(c, :net_kernel, :connect_node, [na])
      reload_ms = node_call(c, :start_and_wait, [])

      say(
        "restarted #{nc} on its old directory: mnesia:start + wait_for_tables took #{ms(reload_ms)} " <>
          "(loaded from #{inspect(call(c, :mnesia, :table_info, [:demo, :load_node]))}, " <>
          "reason #{inspect(call(c, :mnesia, :table_info, [:demo, :load_reason]))})"
      )

      sums = show("all three replicas", [{na, a}, {nb, b}, {nc, c}])
      equal = sums |> Enum.map(&Map.drop(&1, [:storage])) |> Enum.uniq() |> length() == 1
      expected = n + div(n, 5) - div(n, 10) - 1
      ok = equal and hd(sums).size == expected and hd(sums).index_moved == div(n, 10)

      say(
        "all replicas equal: #{equal}; size #{hd(sums).size} (expected #{expected}); " <>
          "index_read(:moved) #{hd(sums).index_moved} keys (expected #{div(n, 10)}); " <>
          "demo took #{div(System.monotonic_time(:millisecond) - t_start, 1000)} s"
      )

      if ok, do: say("RESULT: ok"), else: raise("replicas differ")
    after
      for vm <- Process.get(:vms), Process.alive?(vm), do: :peer.stop(vm)
      File.rm_rf!(root)
      say("stopped every node, removed #{root}")
    end
  end

  defp show(title, nodes) do
    say(title <> ":")

    for {name, vm} <- nodes do
      s = node_call(vm, :summary, [])

      say(
        "  #{name}: size #{s.size}, first..last #{s.first}..#{s.last}, checksum #{s.checksum}, " <>
          "index checksum #{s.index_checksum} (tag 3: #{s.index_3} keys, :moved: #{s.index_moved})"
      )

      s
    end
  end

  defp child(name, cookie, node_bin, dir) do
    args = [~c"-setcookie", cookie | Enum.flat_map(:code.get_path(), &[~c"-pa", &1])]
    {:ok, vm, _} = :peer.start(%{name: name, connection: :standard_io, args: args})
    Process.put(:vms, [vm | Process.get(:vms)])
    {:ok, _} = :peer.call(vm, :application, :ensure_all_started, [:elixir])

    {:module, _} =
      :peer.call(vm, :code, :load_binary, [MnesiaDemo.Node, ~c"mnesia_demo.exs", node_bin])

    :ok = node_call(vm, :setup, [dir])
    vm
  end

  defp node_call(vm, f, a), do: call(vm, MnesiaDemo.Node, f, a)
  defp call(vm, m, f, a), do: :peer.call(vm, m, f, a, 600_000)
  defp ms(x), do: "#{:erlang.float_to_binary(x / 1, decimals: 0)} ms"
  defp say(s), do: IO.puts("[#{Time.utc_now() |> Time.truncate(:second)}] " <> s)
end

MnesiaDemo.main(System.argv(), node_bin)
