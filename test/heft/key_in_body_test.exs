defmodule Heft.KeyInBodyTest do
  # A set's or ordered_set's record body writes every small integer, atom or
  # binary equal to the record's key as the `key` tag (docs/term-format.md,
  # "Records"), so an object that names its own key (`{id, %{id: id, ...}}`)
  # stores it once. Bag bodies are left as they were.
  use ExUnit.Case, async: true
  import Bitwise

  @moduletag :tmp_dir

  # Keys that are written as `key` again inside the body, and keys that are
  # not (integers past the VM's small ones, floats, compounds), whose
  # objects must come back as exactly.
  @again [300, -5000, (1 <<< 59) - 1, 7, :a_key, "a binary key", <<>>]
  @not_again [1 <<< 59, 1 <<< 70, 2.5, {:k, 1}, [1, 2]]

  # The key in a field, in a list, as a map key and a map value, beside
  # terms that are equal but not the same (1 and 1.0 in an ordered_set).
  defp object(k), do: {k, %{k => k, id: k, tags: [k, :x, k]}, {k}, [k | k]}

  defp exact!(got, want) do
    assert got === want
    assert :erlang.term_to_binary(got) == :erlang.term_to_binary(want)
  end

  defp stored(type, objects) do
    tab = Heft.new(:stored, [type, compression: :none])
    true = Heft.insert(tab, objects)
    bytes = Heft.info(tab, :payload_stored_bytes)
    Heft.delete(tab)
    bytes
  end

  for type <- [:set, :ordered_set] do
    test "#{type}: objects holding their key again come back exact" do
      tab = Heft.new(:again, [unquote(type)])

      for k <- @again ++ @not_again do
        obj = object(k)
        true = Heft.insert(tab, obj)
        [got] = Heft.lookup(tab, k)
        exact!(got, obj)
        exact!(Heft.lookup_element(tab, k, 2), elem(obj, 1))
        assert Heft.match_object(tab, {k, :_, {k}, :_}) == [obj]
        assert Heft.select(tab, [{{:"$1", :_, {:"$1"}, :_}, [], [:"$1"]}]) |> Enum.member?(k)
      end

      assert Heft.info(tab, :size) == length(@again ++ @not_again)
      assert Enum.sort(Heft.tab2list(tab)) == Enum.sort(Enum.map(@again ++ @not_again, &object/1))
    end

    test "#{type}: the key stored again takes one byte" do
      # 300 is 3 bytes encoded (tag, zigzag varint), "a binary key" 14: the
      # same objects with values of the same sizes that are not the key
      # (all different, so that none is shared) store 2 and 13 more bytes
      # for each occurrence.
      for {k, [a, b, c], saved} <- [
            {300, [301, 302, 303], 2},
            {"a binary key", ["other key 01", "other key 02", "other key 03"], 13}
          ] do
        assert stored(unquote(type), {k, k, [k, k]}) + 3 * saved ==
                 stored(unquote(type), {k, a, [b, c]})
      end
    end

    test "#{type}: counters and element updates next to the key" do
      tab = Heft.new(:counters, [unquote(type)])
      true = Heft.insert(tab, {500, 500, 500})
      assert Heft.update_counter(tab, 500, {2, 1}) == 501
      assert Heft.lookup(tab, 500) == [{500, 501, 500}]
      assert Heft.update_element(tab, 500, {2, 500})
      assert Heft.lookup(tab, 500) == [{500, 500, 500}]
      assert Heft.update_counter(tab, 500, {3, -500}) == 0
      assert Heft.lookup(tab, 500) == [{500, 500, 0}]
      assert Heft.delete_object(tab, {500, 500, 1}) == true
      assert Heft.lookup(tab, 500) == [{500, 500, 0}]
      assert Heft.delete_object(tab, {500, 500, 0}) == true
      assert Heft.lookup(tab, 500) == []
    end
  end

  test "an ordered_set keeps 1 and 1.0 apart inside the object" do
    tab = Heft.new(:floats, [:ordered_set])
    true = Heft.insert(tab, {1, 1.0, 1, [1.0 | 1]})
    exact!(Heft.lookup(tab, 1.0), [{1, 1.0, 1, [1.0 | 1]}])
    true = Heft.insert(tab, {1.0, 1, 1.0})
    exact!(Heft.lookup(tab, 1), [{1.0, 1, 1.0}])
  end

  test "keypos other than 1" do
    tab = Heft.new(:keypos, [:set, keypos: 2])
    obj = {"k", 900, %{owner: 900}, "k"}
    true = Heft.insert(tab, obj)
    exact!(Heft.lookup(tab, 900), [obj])
  end

  for type <- [:bag, :duplicate_bag] do
    test "#{type}: bodies are stored as before and objects told apart as before" do
      assert stored(unquote(type), {300, 300}) == stored(unquote(type), {300, 301})
      tab = Heft.new(:bags, [unquote(type)])
      true = Heft.insert(tab, [{300, 300}, {300, 300}, {300, 301}])
      want = if unquote(type) == :bag, do: 2, else: 3
      assert length(Heft.lookup(tab, 300)) == want
      true = Heft.delete_object(tab, {300, 300})
      assert Heft.lookup(tab, 300) == [{300, 301}]
    end
  end

  test "a persistent table reads such objects back from its log, its snapshot and a tab file",
       %{tmp_dir: tmp} do
    dir = Path.join(tmp, "t")
    objects = Enum.map(@again ++ @not_again, &object/1)
    t = Heft.new(:persisted, [:set, persist: dir])
    true = Heft.insert(t, objects)
    :ok = Heft.close(t)
    {:ok, t} = Heft.open(dir)
    assert Enum.sort(Heft.tab2list(t)) == Enum.sort(objects)
    :ok = Heft.dump(t)
    :ok = Heft.close(t)
    {:ok, t} = Heft.open(dir)
    assert Enum.sort(Heft.tab2list(t)) == Enum.sort(objects)
    file = Path.join(tmp, "t.tab")
    :ok = Heft.tab2file(t, file)
    :ok = Heft.close(t)
    {:ok, back} = Heft.file2tab(file)
    assert Enum.sort(Heft.tab2list(back)) == Enum.sort(objects)
  end
end
