defmodule Heft.AccountingTest do
  # Heft's byte figures must match what the kernel sees. 200,000 records of
  # {i, 100-tuple of 10-atom lists} (16,872 bytes each in an ETS set) must
  # cost at most 200 bytes each in Heft, and info(tab, :memory) must be
  # within 10% of the growth the kernel shows while loading them. Heft's
  # memory is its two mappings (arena and index), so the kernel's
  # per-mapping figures in /proc/self/smaps show it exactly; the process's
  # total RSS also moves with the BEAM's own allocators (which return and
  # take memory at times of their choosing), so it is reported, not
  # asserted on.
  use ExUnit.Case, async: false

  @count 200_000
  # The table's mappings are named after it: heft:NAME (a memfd, or
  # anonymous memory, named where the kernel can) and heft-index:NAME
  # (anonymous, or a memfd).
  @name :heft_accounting_200k

  test "the 100-tuple record: <= 200 bytes each, within 10% of RSS growth" do
    # Load from a fresh process holding one shared list, so the loader's
    # own heap stays small and nearly all growth is Heft's.
    parent = self()

    spawn_link(fn ->
      list = List.duplicate(:a, 10)
      :erlang.garbage_collect()
      t = Heft.new(@name, [:public])
      {heft0, rss0} = {heft_rss(), rss()}

      for i <- 1..@count do
        Heft.insert(t, {i, :erlang.make_tuple(100, list)})
      end

      Heft.give_away(t, parent, {heft_rss() - heft0, rss() - rss0})
    end)

    assert_receive {:"HEFT-TRANSFER", t, _loader, {growth, process_growth}}, 60_000
    memory = Heft.info(t, :memory)
    per_record = memory / @count
    assert per_record <= 200, "#{per_record} bytes per record"

    # On huge pages the arena's resident memory runs up to one 2 MiB page
    # ahead of what it holds (see Heft's moduledoc).
    slack = if huge_arena?(), do: 2 * 1024 * 1024, else: 0

    assert abs(memory - growth) <= 0.10 * growth + slack,
           "info :memory #{memory} vs kernel's growth of Heft's mappings #{growth}"

    IO.puts(
      "\n200,000 100-tuple records: #{Float.round(per_record, 1)} bytes each; " <>
        "info :memory #{memory}, Heft's mappings grew #{growth}, process RSS grew #{process_growth}"
    )

    # The kernel's view of the arena agrees with Heft's own: to a page, or
    # on huge pages to the 2 MiB page the arena's end lies in.
    info = Heft.info(t)
    page = if huge_arena?(), do: 2 * 1024 * 1024, else: 4096
    assert_in_delta info[:arena_resident_bytes], info[:arena_used_bytes], page + 4096
    assert Heft.lookup(t, 12_345) == [{12_345, :erlang.make_tuple(100, List.duplicate(:a, 10))}]
    Heft.delete(t)
  end

  # Resident bytes of this test's table's two mappings, from
  # /proc/self/smaps (only its own: other tests' tables may be released
  # meanwhile).
  defp heft_rss do
    # The arena is anonymous memory the kernel may not name: by address.
    name = "heft:#{@name}"

    anon =
      for {start, ^name} <- Heft.Native.anonymous_arenas(),
          do: String.downcase(Integer.to_string(start, 16)) <> "-"

    "/proc/self/smaps"
    |> File.read!()
    |> String.split("\n")
    |> Enum.reduce({false, 0}, fn line, {in_heft, sum} ->
      cond do
        Regex.match?(~r/^[0-9a-f]+-[0-9a-f]+ /, line) ->
          {ours?(line) or String.starts_with?(line, anon), sum}

        in_heft and String.starts_with?(line, "Rss:") ->
          {true, sum + kb(line)}

        true ->
          {in_heft, sum}
      end
    end)
    |> elem(1)
  end

  defp ours?(line) do
    String.contains?(line, [
      "/memfd:heft:#{@name} ",
      "/memfd:heft-index:#{@name} ",
      "[anon:heft:#{@name}]",
      "[anon:heft-index:#{@name}]"
    ]) or String.ends_with?(line, ["/memfd:heft:#{@name}", "/memfd:heft-index:#{@name}"])
  end

  # True when the table's arena is anonymous memory (on huge pages).
  defp huge_arena? do
    name = "heft:#{@name}"
    Enum.any?(Heft.Native.anonymous_arenas(), fn {_, n} -> n == name end)
  end

  defp kb(line), do: line |> String.split() |> Enum.at(1) |> String.to_integer() |> Kernel.*(1024)

  defp rss do
    "/proc/self/status"
    |> File.read!()
    |> String.split("\n")
    |> Enum.find_value(fn
      "VmRSS:" <> rest -> rest |> String.trim() |> String.split() |> hd() |> String.to_integer()
      _ -> nil
    end)
    |> Kernel.*(1024)
  end
end
