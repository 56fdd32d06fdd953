defmodule Heft.LeakTest do
  # Tables must not leak native memory: after 1,000 tables are created and
  # dropped (by delete/1 and by their owner's death), the number of tables
  # with allocated storage and the arena bytes mapped into this process are
  # back where they started.
  use ExUnit.Case, async: false

  test "1,000 tables created and dropped leave nothing behind" do
    # Warm up: the first table creates the registry and the reaper thread.
    Heft.delete(Heft.new(:warmup, []))
    live0 = settled_live_tables()
    mapped0 = heft_mapped_bytes()

    for i <- 1..500 do
      t = Heft.new(:leak, [])
      Heft.insert(t, for(k <- 1..20, do: {k, i, "value #{k}"}))
      Heft.delete(t)
    end

    owners =
      for i <- 1..500 do
        spawn(fn ->
          t = Heft.new(:leak_owned, [])
          Heft.insert(t, {i, :erlang.make_tuple(50, :x)})
          receive do: (:stop -> :ok)
        end)
      end

    assert Heft.Test.Wait.until(fn -> Heft.Native.live_tables() >= live0 + 500 end)
    assert heft_mapped_bytes() > mapped0

    for pid <- owners, do: send(pid, :stop)

    assert Heft.Test.Wait.until(fn -> Heft.Native.live_tables() == live0 end),
           "live tables: #{Heft.Native.live_tables()}, expected #{live0}"

    assert Heft.Test.Wait.until(fn -> heft_mapped_bytes() == mapped0 end),
           "mapped arena bytes: #{heft_mapped_bytes()}, expected #{mapped0}"
  end

  test "an owner that exits while a long change holds its table leaves nothing behind" do
    # The exit does not wait for the lock: the reaper thread frees the
    # table once the change lets go.
    Heft.delete(Heft.new(:warmup, []))
    live0 = settled_live_tables()
    parent = self()

    owner =
      spawn(fn ->
        send(parent, {:table, Heft.new(:owned, [:public])})
        receive do: (:never -> :ok)
      end)

    t = receive do: ({:table, t} -> t)
    assert Heft.Native.live_tables() == live0 + 1
    holder = Task.async(fn -> Heft.Native.debug_hold_lock(t.ref, 300) end)
    assert Heft.Test.Wait.until(fn -> Heft.Native.lookup(t.ref, 1) == :"$heft_cpu" end)
    Process.exit(owner, :kill)
    assert Heft.Test.Wait.until(fn -> Heft.info(t) == :undefined end)
    assert Task.await(holder)
    assert Heft.Test.Wait.until(fn -> Heft.Native.live_tables() == live0 end)
  end

  # The tables of earlier tests may still be going (owners that died, the
  # reaper not done yet): the count once it has stopped changing.
  defp settled_live_tables do
    for pid <- Process.list(), do: :erlang.garbage_collect(pid)
    settle(Heft.Native.live_tables(), 50)
  end

  defp settle(live, tries) do
    Process.sleep(100)

    case Heft.Native.live_tables() do
      ^live -> live
      now when tries > 0 -> settle(now, tries - 1)
      now -> flunk("the live tables did not settle: #{live}, then #{now}")
    end
  end

  # Bytes of all Heft mappings (arenas and index slot arrays: memfds, or
  # named anonymous memory) mapped into this process, from the kernel.
  defp heft_mapped_bytes do
    # Anonymous arenas by their start address (the kernel may not name them).
    anon = for {start, _name} <- Heft.Native.anonymous_arenas(), do: Integer.to_string(start, 16)

    "/proc/self/maps"
    |> File.read!()
    |> String.split("\n")
    |> Enum.filter(fn line ->
      String.contains?(line, ["/memfd:heft", "[anon:heft"]) or
        String.starts_with?(line, Enum.map(anon, &(String.downcase(&1) <> "-")))
    end)
    |> Enum.uniq()
    |> Enum.map(fn line ->
      [range | _] = String.split(line, " ")
      [from, to] = range |> String.split("-") |> Enum.map(&String.to_integer(&1, 16))
      to - from
    end)
    |> Enum.sum()
  end
end
