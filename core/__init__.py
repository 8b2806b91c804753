"""What every stage shares: the model's arithmetic (numerics), weight and activation formats and their
block layouts, page and slice sizes, the errors bad input raises. Imports no other llmplan folder."""
