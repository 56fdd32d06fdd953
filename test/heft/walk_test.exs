defmodule Heft.WalkTest do
  # Walks over a table while it changes: stream/1 and first/next must return
  # every object present for the whole walk exactly once, whatever is
  # inserted or deleted meanwhile (the index keeps a stable order and walks
  # resume from the last key, not from a position). The changes are made
  # between steps of the walk, so they are certain to interleave with it,
  # and they grow the table several times over (forcing index rebuilds).
  use ExUnit.Case, async: true

  @stable 20_000

  setup do
    t = Heft.new(:walk, [:public])
    Heft.insert(t, for(k <- 1..@stable, do: {k, :stable}))
    %{t: t}
  end

  # One round of changes outside the stable range: 2,000 inserts, then
  # two thirds of them deleted again.
  defp churn(t, n) do
    batch = for k <- 1..2_000, do: {{:volatile, n, k}, :x}
    Heft.insert(t, batch)
    for {key, _} <- batch, rem(elem(key, 2), 3) != 0, do: Heft.delete(t, key)
  end

  test "stream/1 returns each stable object exactly once while the table changes", %{t: t} do
    keys =
      t
      |> Heft.stream()
      |> Stream.with_index()
      |> Stream.each(fn {_, i} -> if rem(i, 400) == 0, do: churn(t, i) end)
      |> Enum.map(fn {{key, _}, _} -> key end)

    assert Heft.info(t, :size) > 3 * @stable, "the table grew during the walk"
    stable = Enum.filter(keys, &is_integer/1)
    assert Enum.sort(stable) == Enum.to_list(1..@stable)
    assert length(keys) == length(Enum.uniq(keys)), "some key came twice"
  end

  test "first/next visits each stable key once while the table changes", %{t: t} do
    keys = walk(t, Heft.first(t), [], 0)
    assert keys |> Enum.filter(&is_integer/1) |> Enum.sort() == Enum.to_list(1..@stable)
    assert length(keys) == length(Enum.uniq(keys))
  end

  test "deleting the stable keys behind the walk does not disturb it", %{t: t} do
    keys =
      t
      |> Heft.stream()
      |> Stream.each(fn {k, _} -> if is_integer(k), do: Heft.delete(t, k) end)
      |> Enum.map(&elem(&1, 0))

    assert Enum.sort(keys) == Enum.to_list(1..@stable)
    assert Heft.info(t, :size) == 0
  end

  test "next/2 continues from a key that has been deleted (ETS would raise)", %{t: t} do
    k = Heft.first(t)
    after_k = Heft.next(t, k)
    Heft.delete(t, k)
    assert Heft.next(t, k) == after_k
  end

  test "a stream can be taken from lazily and abandoned", %{t: t} do
    assert t |> Heft.stream() |> Enum.take(3) |> length() == 3
    assert Heft.foldl(fn {_, :stable}, n -> n + 1 end, 0, t) == @stable
  end

  defp walk(_t, :"$end_of_table", acc, _i), do: acc

  defp walk(t, key, acc, i) do
    if rem(i, 400) == 0, do: churn(t, i)
    walk(t, Heft.next(t, key), [key | acc], i + 1)
  end
end
