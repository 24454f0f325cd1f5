"""Repository templates (part A): correct source code plus example calls per function.

Expected values are never written here: the generator computes them by running the correct
code, so an example can only be wrong if the code is. Examples are chosen so that typical
single-site bugs change at least one of them.
"""

from legorl_jax.taskgen.synthetic.template import Module, Template

INVENTORY = Template(
    name="inventory", package="inventory",
    title="Inventory", summary="Track stock levels, reorder points and stock value for a small shop.",
    modules=(
        Module("stock", "Stock level bookkeeping.", '''
def restock(levels, item, quantity):
    """Return a copy of ``levels`` with ``quantity`` units of ``item`` added."""
    if quantity < 0:
        raise ValueError("quantity must be non-negative")
    updated = dict(levels)
    updated[item] = updated.get(item, 0) + quantity
    return updated


def remove_stock(levels, item, quantity):
    """Return a copy of ``levels`` with ``quantity`` units of ``item`` taken out.

    Raises ValueError when there is not enough stock.
    """
    have = levels.get(item, 0)
    if quantity > have:
        raise ValueError("not enough stock")
    updated = dict(levels)
    updated[item] = have - quantity
    return updated


def low_stock(levels, threshold):
    """Names of items whose level is at or below ``threshold``, sorted."""
    return sorted(name for name, count in levels.items() if count <= threshold)
''', {
            "restock": ["restock({'apple': 3}, 'apple', 2)", "restock({}, 'pear', 5)",
                        "restock({'fig': 1}, 'kiwi', 0)"],
            "remove_stock": ["remove_stock({'apple': 5}, 'apple', 2)", "remove_stock({'apple': 5}, 'apple', 5)",
                             "remove_stock({'apple': 1, 'fig': 4}, 'fig', 3)"],
            "low_stock": ["low_stock({'a': 1, 'b': 5, 'c': 2}, 2)", "low_stock({'a': 3, 'b': 4}, 3)",
                          "low_stock({'x': 10}, 0)"],
        }),
        Module("value", "Stock valuation and reordering.", '''
def stock_value(levels, prices):
    """Total value of the stock: sum of count * unit price over items with a price."""
    total = 0.0
    for item, count in levels.items():
        if item in prices:
            total += count * prices[item]
    return round(total, 2)


def reorder_quantity(level, target, pack_size):
    """Units to order to reach ``target``, rounded up to whole packs of ``pack_size``."""
    missing = target - level
    if missing <= 0:
        return 0
    packs = (missing + pack_size - 1) // pack_size
    return packs * pack_size


def most_valuable(levels, prices):
    """Name of the item with the largest count * price (ties: the first in name order)."""
    best_name, best_value = None, -1.0
    for item in sorted(levels):
        value = levels[item] * prices.get(item, 0.0)
        if value > best_value:
            best_name, best_value = item, value
    return best_name
''', {
            "stock_value": ["stock_value({'a': 2, 'b': 3}, {'a': 1.5, 'b': 2.0})",
                            "stock_value({'a': 2, 'z': 9}, {'a': 0.25})", "stock_value({}, {'a': 1.0})"],
            "reorder_quantity": ["reorder_quantity(3, 10, 4)", "reorder_quantity(10, 10, 4)",
                                 "reorder_quantity(0, 12, 6)", "reorder_quantity(11, 10, 5)"],
            "most_valuable": ["most_valuable({'a': 2, 'b': 1}, {'a': 1.0, 'b': 5.0})",
                              "most_valuable({'a': 2, 'b': 1}, {'a': 1.0, 'b': 2.0})",
                              "most_valuable({'c': 4, 'd': 1}, {'c': 1.0, 'd': 3.0})"],
        }),
    ))

TEXTSTATS = Template(
    name="textstats", package="textstats",
    title="Text statistics", summary="Word counts, averages and simple readability figures for plain text.",
    modules=(
        Module("words", "Splitting text into words and counting them.", '''
def words(text):
    """Lower-cased words of ``text``; punctuation at either end of a word is dropped."""
    out = []
    for raw in text.split():
        word = raw.strip(".,;:!?\\"'()").lower()
        if word:
            out.append(word)
    return out


def word_frequencies(text):
    """Mapping word -> number of occurrences."""
    counts = {}
    for word in words(text):
        counts[word] = counts.get(word, 0) + 1
    return counts


def top_words(text, n):
    """The ``n`` most frequent words, most frequent first, ties in alphabetical order."""
    counts = word_frequencies(text)
    ranked = sorted(counts, key=lambda w: (-counts[w], w))
    return ranked[:n]
''', {
            "words": ["words('Hello, world!')", "words('  A b  c. ')", "words('(Quoted) text!')"],
            "word_frequencies": ["word_frequencies('a b a c a b')", "word_frequencies('One one ONE')",
                                 "word_frequencies('')"],
            "top_words": ["top_words('b a b c a b', 2)", "top_words('x y z', 1)", "top_words('a a b', 5)"],
        }),
        Module("measures", "Averages over words and sentences.", '''
def average_word_length(text):
    """Mean number of letters per whitespace-separated word; 0.0 for empty text."""
    tokens = text.split()
    if not tokens:
        return 0.0
    letters = sum(len(t) for t in tokens)
    return letters / len(tokens)


def sentence_count(text):
    """Number of sentences, counting '.', '!' and '?' runs as sentence ends."""
    count = 0
    previous_end = False
    for ch in text:
        is_end = ch in ".!?"
        if is_end and not previous_end:
            count += 1
        previous_end = is_end
    return count


def longest_word(text):
    """The longest word (the first one on ties); '' for empty text."""
    best = ""
    for token in text.split():
        if len(token) > len(best):
            best = token
    return best
''', {
            "average_word_length": ["average_word_length('ab abcd')", "average_word_length('')",
                                    "average_word_length('a bb ccc')"],
            "sentence_count": ["sentence_count('Hi. Bye!')", "sentence_count('Wait... what?!')",
                               "sentence_count('no end')"],
            "longest_word": ["longest_word('a abc ab')", "longest_word('xy zw')", "longest_word('')"],
        }),
    ))

GEOMETRY = Template(
    name="geometry", package="geometry",
    title="Geometry", summary="Areas, perimeters and distances for points, rectangles and polygons.",
    modules=(
        Module("shapes", "Areas and perimeters of simple shapes.", '''
def rectangle_area(width, height):
    """Area of a width x height rectangle; negative sizes are an error."""
    if width < 0 or height < 0:
        raise ValueError("sizes must be non-negative")
    return width * height


def rectangle_perimeter(width, height):
    """Perimeter of a width x height rectangle."""
    return 2 * (width + height)


def polygon_area(points):
    """Area of a simple polygon given as a list of (x, y) vertices (shoelace formula)."""
    n = len(points)
    if n < 3:
        return 0.0
    total = 0.0
    for i in range(n):
        x1, y1 = points[i]
        x2, y2 = points[(i + 1) % n]
        total += x1 * y2 - x2 * y1
    return abs(total) / 2
''', {
            "rectangle_area": ["rectangle_area(3, 4)", "rectangle_area(0, 5)", "rectangle_area(2.5, 2)"],
            "rectangle_perimeter": ["rectangle_perimeter(3, 4)", "rectangle_perimeter(1, 1)",
                                    "rectangle_perimeter(0, 7)"],
            "polygon_area": ["polygon_area([(0, 0), (4, 0), (4, 3)])",
                             "polygon_area([(0, 0), (2, 0), (2, 2), (0, 2)])", "polygon_area([(0, 0), (1, 1)])"],
        }),
        Module("points", "Distances and bounding boxes of points.", '''
def manhattan(p, q):
    """Manhattan distance between points ``p`` and ``q``."""
    return abs(p[0] - q[0]) + abs(p[1] - q[1])


def bounding_box(points):
    """(min_x, min_y, max_x, max_y) of a non-empty list of points."""
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    return (min(xs), min(ys), max(xs), max(ys))


def closest_to_origin(points):
    """The point with the smallest squared distance to (0, 0); the first one on ties."""
    best, best_d = None, None
    for x, y in points:
        d = x * x + y * y
        if best_d is None or d < best_d:
            best, best_d = (x, y), d
    return best
''', {
            "manhattan": ["manhattan((0, 0), (3, 4))", "manhattan((1, 5), (4, 1))", "manhattan((2, 2), (2, 2))"],
            "bounding_box": ["bounding_box([(1, 5), (3, 2), (0, 4)])", "bounding_box([(2, 2)])",
                             "bounding_box([(-1, 0), (1, -3)])"],
            "closest_to_origin": ["closest_to_origin([(3, 4), (1, 1), (2, 0)])",
                                  "closest_to_origin([(1, 0), (0, 1)])", "closest_to_origin([(5, 5), (-1, -2)])"],
        }),
    ))

MATRIX = Template(
    name="matrix", package="matrixutils",
    title="Matrix utilities", summary="Small dense-matrix helpers on lists of lists.",
    modules=(
        Module("ops", "Element-wise and product operations.", '''
def transpose(m):
    """Transpose of a rectangular matrix given as a list of rows."""
    if not m:
        return []
    return [[row[j] for row in m] for j in range(len(m[0]))]


def matmul(a, b):
    """Matrix product of a (n x k) and b (k x m)."""
    if len(a[0]) != len(b):
        raise ValueError("inner dimensions differ")
    return [[sum(a[i][t] * b[t][j] for t in range(len(b))) for j in range(len(b[0]))]
            for i in range(len(a))]


def scale(m, factor):
    """Every entry multiplied by ``factor``."""
    return [[x * factor for x in row] for row in m]
''', {
            "transpose": ["transpose([[1, 2, 3], [4, 5, 6]])", "transpose([])", "transpose([[7]])"],
            "matmul": ["matmul([[1, 2], [3, 4]], [[5, 6], [7, 8]])", "matmul([[1, 2, 3]], [[1], [0], [2]])",
                       "matmul([[2]], [[3, 4]])"],
            "scale": ["scale([[1, 2], [3, 4]], 3)", "scale([[1.5]], 2)", "scale([[1, -1]], 0)"],
        }),
        Module("props", "Properties of square matrices.", '''
def trace(m):
    """Sum of the diagonal of a square matrix."""
    return sum(m[i][i] for i in range(len(m)))


def is_symmetric(m):
    """True when the square matrix equals its transpose."""
    n = len(m)
    for i in range(n):
        for j in range(i + 1, n):
            if m[i][j] != m[j][i]:
                return False
    return True


def identity(n):
    """The n x n identity matrix."""
    return [[1 if i == j else 0 for j in range(n)] for i in range(n)]
''', {
            "trace": ["trace([[1, 2], [3, 4]])", "trace([[5]])", "trace([[1, 0, 0], [0, 2, 0], [0, 0, 3]])"],
            "is_symmetric": ["is_symmetric([[1, 2], [2, 1]])", "is_symmetric([[1, 2], [3, 1]])",
                             "is_symmetric([[1, 0, 5], [0, 1, 0], [4, 0, 1]])"],
            "identity": ["identity(2)", "identity(1)", "identity(3)"],
        }),
    ))

TEMPLATES_A = (INVENTORY, TEXTSTATS, GEOMETRY, MATRIX)
