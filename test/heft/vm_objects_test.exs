defmodule Heft.VmObjectsTest do
  # A reference that stands for an object of the VM (:atomics, :counters,
  # NIF resources) keeps its object alive while a record holds it, as in
  # ETS, though Heft stores the reference as bytes (native vm_refs.rs).
  use ExUnit.Case, async: false

  @types [:set, :ordered_set, :bag, :duplicate_bag]

  # Makes `n` objects in a process that then exits, and stores records
  # naming them (in the key, the body, a map, a list); nothing else holds
  # them afterwards.
  defp store_from_elsewhere(tables, n, size \\ 1) do
    Task.async(fn ->
      for i <- 1..n do
        a = :atomics.new(size, [])
        :atomics.put(a, 1, i)
        c = :counters.new(1, [])
        :counters.add(c, 1, 10 * i)
        for t <- tables, do: insert(t, [{i, a, %{c: [c]}}, {{:by_ref, a}, i}])
      end

      :ok
    end)
    |> Task.await(60_000)

    collect()
  end

  defp insert({:ets, t}, objects), do: :ets.insert(t, objects)
  defp insert(t, objects), do: Heft.insert(t, objects)

  defp collect do
    for p <- Process.list(), do: :erlang.garbage_collect(p)
    :ok
  end

  # The VM's memory once what earlier tests left is gone: garbage is
  # collected and objects whose last reference went are freed (a moment
  # later), so that it does not fall under a test's feet (at most 2 s).
  defp settled_memory(last \\ nil, tries \\ 100) do
    collect()
    now = :erlang.memory(:total)

    if tries == 0 or (last != nil and abs(now - last) < 1_000_000) do
      now
    else
      Process.sleep(20)
      settled_memory(now, tries - 1)
    end
  end

  test "a stored :atomics or :counters reference stays usable, as in ETS" do
    for type <- @types do
      # Each table alone holds its own objects.
      t = Heft.new(:objects, [type, :public])
      ets = :ets.new(:objects, [type, :public])
      store_from_elsewhere([t], 20)
      store_from_elsewhere([{:ets, ets}], 20)

      for {lookup, tab} <- [{&Heft.lookup/2, t}, {&:ets.lookup/2, ets}], i <- 1..20 do
        [{^i, a, %{c: [c]}}] = lookup.(tab, i)
        assert :atomics.get(a, 1) == i, inspect(type)
        assert :counters.get(c, 1) == 10 * i
        assert lookup.(tab, {:by_ref, a}) == [{{:by_ref, a}, i}]
      end

      Heft.delete(t)
      :ets.delete(ets)
    end
  end

  test "the object goes once no record holds its reference" do
    # 20 arrays of 1,000,000 atomics: 160 MB held while records name them.
    for type <- @types do
      t = Heft.new(:objects, [type, :public])
      base = settled_memory()
      store_from_elsewhere([t], 20, 1_000_000)
      held = :erlang.memory(:total) - base
      assert held > 150_000_000, inspect({type, held})

      # Objects 1..10 lose every record naming them: overwritten,
      # deleted, selected away.
      Heft.insert(t, {1, :no_object, %{}})
      Heft.delete(t, 2)
      Heft.select_delete(t, [{{:"$1", :_, :_}, [{:"=<", :"$1", 10}], [true]}])
      Heft.select_delete(t, [{{{:by_ref, :_}, :"$1"}, [{:"=<", :"$1", 10}], [true]}])
      # (The VM frees an object a moment after its last reference goes.)
      assert freed_below(base, held - 60_000_000), inspect({type, held})
      assert :erlang.memory(:total) - base > 60_000_000, "records 11..20 still hold theirs"

      Heft.delete_all_objects(t)
      assert freed_below(base, 20_000_000), inspect(type)
      Heft.delete(t)
    end
  end

  test "a deleted table lets its objects go" do
    t = Heft.new(:objects, [:public])
    base = settled_memory()
    store_from_elsewhere([t], 10, 1_000_000)
    assert :erlang.memory(:total) - base > 70_000_000
    Heft.delete(t)
    assert freed_below(base, 20_000_000)
  end

  defp freed_below(base, bytes) do
    Heft.Test.Wait.until(fn ->
      collect()
      :erlang.memory(:total) - base < bytes
    end)
  end
end
