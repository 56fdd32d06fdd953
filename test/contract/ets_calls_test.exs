defmodule Heft.Contract.EtsCallsTest do
  @moduledoc """
  slot/2, init_table/2, repair_continuation/2, to_dets/2, from_dets/2,
  tabfile_info/1, i/0, and the info/2 items :id, :compressed,
  :read_concurrency, :write_concurrency, :decentralized_counters, against
  :ets. (Where Heft answers otherwise on purpose: differences_test.exs.)
  """
  use Heft.Contract.Case, async: true
  import ExUnit.CaptureIO

  @types [:set, :ordered_set, :bag, :duplicate_bag]

  # Every object of slots 0, 1, ... and the number of the slot that was
  # :"$end_of_table".
  defp all_slots(m, tab), do: all_slots(m, tab, 0, [])

  defp all_slots(m, tab, i, acc) do
    case m.slot(tab, i) do
      :"$end_of_table" -> {Enum.concat(Enum.reverse(acc)), i}
      objects when is_list(objects) -> all_slots(m, tab, i + 1, [objects | acc])
    end
  end

  defp objects_for(type) do
    extra = if type in [:bag, :duplicate_bag], do: for(i <- 1..300, do: {i, :second}), else: []
    for(i <- 1..1_000, do: {i, :first}) ++ extra
  end

  describe "slot/2" do
    for type <- @types do
      contract "#{type}: slots 0.. until :\"$end_of_table\" hold every object once", type: type do
        type = unquote(type)
        objects = objects_for(type)
        tab = new_with(m, objects, [type])
        {seen, slots} = all_slots(m, tab)
        assert canonical_sort(seen) == canonical_sort(objects)
        assert_raise ArgumentError, fn -> m.slot(tab, slots + 1) end
        assert_raise ArgumentError, fn -> m.slot(tab, slots + 1_000_000) end
        assert m.slot(tab, slots) == :"$end_of_table"
      end
    end

    contract "bag: a key's objects are in one slot, in their order", type: :bag do
      tab = new_with(m, [{:k, 1}, {:other}, {:k, 2}, {:k, 3}], [:bag])
      {seen, _} = all_slots(m, tab)
      assert Enum.filter(seen, &(elem(&1, 0) == :k)) == m.lookup(tab, :k)
      assert length(m.lookup(tab, :k)) == 3
    end

    contract "ordered_set: slot i is the i-th object in key order", type: :ordered_set do
      objects = for i <- 1..1_500, do: {i * 2, i}
      tab = new_with(m, Enum.shuffle(objects), [:ordered_set])

      for i <- [0, 1, 511, 512, 1_499] do
        assert m.slot(tab, i) == [Enum.at(objects, i)]
      end

      assert m.slot(tab, 1_500) == :"$end_of_table"
      assert_raise ArgumentError, fn -> m.slot(tab, 1_501) end
      assert m.slot(new(m, [:ordered_set]), 0) == :"$end_of_table"
    end

    contract "slot/2 raises ArgumentError for a bad slot, a missing or unreadable table" do
      tab = new_with(m, {1})
      for bad <- [-1, 1.0, :a, "0"], do: assert_raise(ArgumentError, fn -> m.slot(tab, bad) end)
      private = new_with(m, {1}, [:private])
      assert {:raise, ArgumentError} = in_other_process(fn -> m.slot(private, 0) end)
      m.delete(tab)
      assert_raise ArgumentError, fn -> m.slot(tab, 0) end
    end
  end

  describe "init_table/2" do
    # An init fun that hands out `chunks` one by one, and tells the test
    # process when it is called with :close.
    defp init_fun(chunks, test) do
      fn
        :read ->
          case chunks do
            [] -> :end_of_input
            [chunk | rest] -> {chunk, init_fun(rest, test)}
          end

        :close ->
          send(test, {:closed, length(chunks)})
      end
    end

    for type <- @types do
      contract "#{type}: init_table replaces the contents with the fun's objects", type: type do
        type = unquote(type)
        tab = new_with(m, [{:old, 1}, {:older, 2}], [type])
        objects = objects_for(type)
        assert m.init_table(tab, init_fun(Enum.chunk_every(objects, 97), self())) == true
        assert contents(m, tab) == canonical_sort(objects)
        refute_received {:closed, _}
      end
    end

    contract "bag: init_table keeps a key's objects in the order the fun gave them",
      type: :bag do
      tab = new(m, [:bag])
      chunks = [[{:k, 1}, {:k, 2}], [{:k, 3}, {:k, 1}, {:k, 4}]]
      m.init_table(tab, init_fun(chunks, self()))
      assert m.lookup(tab, :k) == [{:k, 1}, {:k, 2}, {:k, 3}, {:k, 4}]
    end

    contract "init_table: a bad object closes the fun and raises, the objects before stay" do
      tab = new_with(m, {:old})
      chunks = [[{1}, {2}], [{3}, :not_a_tuple], [{4}]]

      assert {:caught, :exit} ==
               outcome_or_exit(m, fn -> m.init_table(tab, init_fun(chunks, self())) end)

      # The fun that returned the bad chunk is the one closed.
      assert_received {:closed, 1}
      refute m.member(tab, :old)
      assert m.member(tab, 1) and m.member(tab, 2)
      refute m.member(tab, 4)
    end

    contract "init_table needs write access" do
      tab = new_with(m, {:old})

      assert {:raise, ArgumentError} =
               in_other_process(fn -> m.init_table(tab, fn _ -> :end_of_input end) end)

      assert m.tab2list(tab) == [{:old}]
    end
  end

  # ETS's init_table/2 turns an insert's badarg into an exit; Heft raises
  # ArgumentError (differences_test.exs). Both mean "refused".
  defp outcome_or_exit(:ets, fun), do: outcome(fun)

  defp outcome_or_exit(Heft, fun) do
    case outcome(fun) do
      {:raise, ArgumentError} -> {:caught, :exit}
      other -> other
    end
  end

  describe "repair_continuation/2" do
    for type <- @types do
      contract "#{type}: a continuation through the external format repaired goes on",
        type: type do
        type = unquote(type)
        objects = objects_for(type)
        tab = new_with(m, objects, [type])
        spec = [{{:"$1", :_}, [{:is_integer, :"$1"}], [:"$_"]}]
        {first, cont} = m.select(tab, spec, 100)
        cont = cont |> :erlang.term_to_binary() |> :erlang.binary_to_term()
        repaired = m.repair_continuation(cont, spec)
        rest = collect(m, m.select(repaired))
        assert canonical_sort(first ++ rest) == canonical_sort(objects)
      end
    end

    contract "repair_continuation of :\"$end_of_table\" is :\"$end_of_table\"" do
      assert m.repair_continuation(:"$end_of_table", [{:_, [], [:"$_"]}]) == :"$end_of_table"
    end

    contract "repair_continuation of a continuation that needs none returns it" do
      tab = new_with(m, for(i <- 1..10, do: {i}))
      spec = [{:_, [], [:"$_"]}]
      {_, cont} = m.select(tab, spec, 3)
      assert m.repair_continuation(cont, spec) == cont
    end
  end

  defp collect(_m, :"$end_of_table"), do: []
  defp collect(m, {results, cont}), do: results ++ collect(m, m.select(cont))

  describe "to_dets/2 and from_dets/2" do
    defp open_dets(context) do
      name = unique_name("heft_dets")
      file = Path.join(System.tmp_dir!(), "#{name}.dets")
      on_exit(fn -> File.rm(file) end)
      {:ok, ^name} = :dets.open_file(name, [{:file, String.to_charlist(file)} | context])
      name
    end

    for type <- [:set, :bag, :duplicate_bag] do
      contract "#{type}: to_dets empties the dets table and fills it; from_dets reads it back",
        type: type do
        type = unquote(type)
        objects = objects_for(type)
        tab = new_with(m, objects, [type])
        dets = open_dets(type: type)
        :ok = :dets.insert(dets, {:stale, 0})
        assert m.to_dets(tab, dets) == dets
        assert canonical_sort(:dets.match_object(dets, :_)) == canonical_sort(objects)

        other = new_with(m, {:kept, 1}, [type])
        assert m.from_dets(other, dets) == true
        assert contents(m, other) == canonical_sort([{:kept, 1} | objects])
        :dets.close(dets)
      end
    end

    contract "ordered_set: to_dets and back keeps every object", type: :ordered_set do
      objects = for i <- 1..700, do: {i, -i}
      tab = new_with(m, objects, [:ordered_set])
      dets = open_dets([])
      m.to_dets(tab, dets)
      back = new(m, [:ordered_set])
      m.from_dets(back, dets)
      assert m.tab2list(back) == objects
      :dets.close(dets)
    end

    contract "from_dets replaces objects of the same key in a set" do
      dets = open_dets([])
      :ok = :dets.insert(dets, [{1, :dets}, {2, :dets}])
      tab = new_with(m, [{1, :table}, {3, :table}])
      m.from_dets(tab, dets)
      assert contents(m, tab) == [{1, :dets}, {2, :dets}, {3, :table}]
      :dets.close(dets)
    end

    contract "to_dets/from_dets raise ArgumentError for a closed dets table or a missing table" do
      tab = new_with(m, {1})
      closed = unique_name("heft_closed_dets")
      assert_raise ArgumentError, fn -> m.to_dets(tab, closed) end
      assert_raise ArgumentError, fn -> m.from_dets(tab, closed) end
      dets = open_dets([])
      assert_raise ArgumentError, fn -> m.to_dets(unique_name(), dets) end
      assert_raise ArgumentError, fn -> m.from_dets(unique_name(), dets) end
      private = new_with(m, {1}, [:private])
      assert {:raise, ArgumentError} = in_other_process(fn -> m.to_dets(private, dets) end)
      :dets.close(dets)
    end
  end

  describe "tabfile_info/1" do
    for type <- @types, named <- [false, true] do
      contract "#{type}#{if named, do: ", named"}: tabfile_info has ETS's keys and the table's facts",
        type: type do
        type = unquote(type)
        name = unique_name("heft_tabinfo")
        opts = unquote([type, :public, {:keypos, 2}] ++ if(named, do: [:named_table], else: []))
        tab = new(m, name, opts)
        m.insert(tab, for(i <- 1..321, do: {:x, i, i}))
        file = Path.join(System.tmp_dir!(), "#{name}.tab") |> String.to_charlist()
        on_exit(fn -> File.rm(file) end)
        :ok = m.tab2file(tab, file)

        assert {:ok, info} = m.tabfile_info(file)

        assert Keyword.keys(info) ==
                 [
                   :name,
                   :type,
                   :protection,
                   :named_table,
                   :keypos,
                   :size,
                   :extended_info,
                   :version
                 ]

        assert Keyword.take(info, [:name, :type, :protection, :named_table, :keypos, :size]) == [
                 name: name,
                 type: type,
                 protection: :public,
                 named_table: unquote(named),
                 keypos: 2,
                 size: 321
               ]

        assert is_list(info[:extended_info])
        assert {major, minor} = info[:version]
        assert is_integer(major) and is_integer(minor)
      end
    end

    contract "tabfile_info of a missing or a foreign file is an error" do
      missing = Path.join(System.tmp_dir!(), "#{unique_name()}.tab") |> String.to_charlist()
      assert {:error, _} = m.tabfile_info(missing)
      garbage = Path.join(System.tmp_dir!(), "#{unique_name()}.tab")
      File.write!(garbage, "not a table file at all, not at all")
      on_exit(fn -> File.rm(garbage) end)
      assert {:error, _} = m.tabfile_info(String.to_charlist(garbage))
    end
  end

  describe "i/0" do
    contract "i/0 prints a header and a line for the table, and returns :ok" do
      tab = new_with(m, for(i <- 1..42, do: {i}), [:named_table])
      out = capture_io(fn -> assert m.i() == :ok end)
      [header | _] = String.split(out, "\n")
      assert String.split(header) |> Enum.take(4) == ["id", "name", "type", "size"]
      line = out |> String.split("\n") |> Enum.find(&(&1 =~ Atom.to_string(tab)))
      assert line, "no line for #{inspect(tab)} in:\n#{out}"
      assert line =~ ~r/\bset\s+42\s/
      m.delete(tab)
    end
  end

  describe "i/1" do
    # Runs i/1 with `input` on its standard input; returns what it wrote
    # (prompts included) and the object lines. (ExUnit's capture_io cannot
    # be used: its StringIO refuses ETS's atom prompts.)
    defp browse(m, tab, input) do
      io = spawn_link(fn -> io_server(String.split(input, ~r/(?<=\n)/, trim: true), []) end)
      leader = Process.group_leader()
      Process.group_leader(self(), io)

      try do
        assert m.i(tab) == :ok
      after
        Process.group_leader(self(), leader)
      end

      send(io, {:output, self()})
      out = receive(do: ({:output, ^io, out} -> out))
      # A prompt is not followed by a newline: the next line starts after it.
      lines = for line <- String.split(out, ["\n", "-->"]), line =~ ~r/^<\d+\s*> /, do: line
      {out, lines}
    end

    # An I/O server holding the lines still to be read and what was written.
    defp io_server(input, out) do
      receive do
        {:io_request, from, ref, request} ->
          {reply, input, out} = io_request(request, input, out)
          send(from, {:io_reply, ref, reply})
          io_server(input, out)

        {:output, from} ->
          send(from, {:output, self(), out |> Enum.reverse() |> IO.iodata_to_binary()})
      end
    end

    defp io_request({:put_chars, _encoding, chars}, input, out), do: {:ok, input, [chars | out]}

    defp io_request({:put_chars, _encoding, mod, fun, args}, input, out),
      do: {:ok, input, [apply(mod, fun, args) | out]}

    defp io_request({:get_line, _encoding, prompt}, input, out) do
      out = [:io_lib.format(~c"~ts", [prompt_text(prompt)]) | out]

      case input do
        [line | rest] -> {line, rest, out}
        [] -> {:eof, [], out}
      end
    end

    defp io_request(_other, input, out), do: {{:error, :request}, input, out}

    defp prompt_text(prompt) when is_atom(prompt), do: Atom.to_string(prompt)
    defp prompt_text(prompt), do: prompt

    contract "i/1 pages through every object, numbered, 39 a page", type: :ordered_set do
      tab = new_with(m, for(i <- 1..100, do: {i}), [:ordered_set])
      {out, lines} = browse(m, tab, "c\nc\nq\n")
      assert lines == for(i <- 1..100, do: "<#{String.pad_trailing("#{i}", 4)}> {#{i}}")
      assert length(String.split(out, "(c)ontinue")) == 3
      assert out =~ "EOT"
    end

    contract "i/1: q after the first page shows only it; p prints one object", type: :ordered_set do
      tab = new_with(m, for(i <- 1..100, do: {i}), [:ordered_set])
      {out, lines} = browse(m, tab, "p77\nq\n")
      assert length(lines) == 39
      assert String.contains?(out, "{77}\n")
    end

    contract "i/1: /regexp shows the matching objects only; k deletes the table",
      type: :ordered_set do
      tab = new_with(m, for(i <- 1..100, do: {i}), [:ordered_set])
      {_, lines} = browse(m, tab, "/7\nk\n")
      matching = for i <- 1..100, String.contains?("#{i}", "7"), do: "{#{i}}"
      assert Enum.drop(lines, 39) |> Enum.map(&List.last(String.split(&1, "> "))) == matching
      assert m.info(tab, :size) == :undefined
    end

    contract "i/1: a long object is cut to the width" do
      # Short enough for ETS to print on one line, too long to show whole.
      tab = new_with(m, {1, String.to_atom(String.duplicate("x", 70))})
      {_, [line]} = browse(m, tab, "q\n")
      assert String.length(line) == 7 + (80 - 13) + 5
      assert String.ends_with?(line, "  ...")
    end
  end

  describe "info/2 items of ETS" do
    contract "info(tab, :id) is the table's identifier, for a named table too" do
      tab = new(m)
      assert m.info(tab, :id) == tab
      named = new(m, unique_name(), [:named_table])
      assert m.info(named, :id) == m.whereis(named)
      assert m.info(tab)[:id] == tab
    end

    contract ":compressed is true for a table created :compressed" do
      assert m.info(new(m, [:compressed]), :compressed) == true
    end

    contract ":write_concurrency and :decentralized_counters are false on a default table" do
      tab = new(m)
      assert m.info(tab, :write_concurrency) == false
      assert m.info(tab, :decentralized_counters) == false
      assert is_boolean(m.info(tab, :read_concurrency))
    end

    contract "info/1 has :id, :compressed and the concurrency items" do
      info = m.info(new(m))

      for key <- [
            :id,
            :compressed,
            :read_concurrency,
            :write_concurrency,
            :decentralized_counters
          ] do
        assert Keyword.has_key?(info, key), "#{key} missing"
      end
    end

    contract "info of a missing table is :undefined, whatever the item" do
      name = unique_name()
      assert m.info(name) == :undefined

      for item <- [:size, :id, :fixed, :safe_fixed, :compressed, :no_such_item] do
        assert m.info(name, item) == :undefined
      end

      tab = new(m)
      m.delete(tab)
      assert m.info(tab, :no_such_item) == :undefined
      assert_raise ArgumentError, fn -> m.info(new(m), :no_such_item) end
    end
  end
end
